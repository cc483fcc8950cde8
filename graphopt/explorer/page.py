"""The explorer's page: one self-contained HTML file (its CSS and JavaScript inline, the data
as JSON in a `<script type="application/json">`), which makes no network request and opens
from disk in any browser.

The CSS and JavaScript are files of this package (page.css, page.js), read with
importlib.resources; the page's structure is page.html, with three places to fill.
"""
from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _json_for_script(data: Any) -> str:
    """JSON that cannot end the script element it sits in (`</script>`, `<!--`): every `<`
    is written as its escape, which JSON.parse reads back as `<`."""
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")


def render_page(data: dict[str, Any]) -> str:
    """The page's HTML for data made by `explorer.data.gather`."""
    parts = {"title": html.escape(data["title"]), "css": _asset("page.css"),
             "data": _json_for_script(data), "js": _asset("page.js")}
    # One pass over the template: what is put in is not searched again (the data may hold
    # any text, `{{js}}` too).
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("page.html"))
