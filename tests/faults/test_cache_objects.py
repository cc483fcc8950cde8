"""Family 6: a cache entry whose header and digest are right but whose payload is not this
kernel's object code (garbage, another kernel's code, a cut or damaged ELF file) is a
corrupt entry: linker.check refuses it before anything is linked, the kernel is compiled
again and the entry replaced, with one CacheWarning. Each case runs in a child process."""
import pytest

SETUP = """
    import warnings, numpy as np, graphopt as go
    from graphopt import diskcache as cache
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    f = go.jit(lambda x: go.ops.exp(x) * 2 + 1, backend="llvm")
    g = go.jit(lambda x: x * 3 - 1, backend="llvm")
    def entry(fn):
        (k,) = fn.lower(x).kernels
        return k.key, k.key_parts
"""

DAMAGE = {
    "garbage": "payload = bytes(range(256)) * 40",
    "empty": "payload = b''",
    "another kernel's code": "payload = cache.load(*entry(g))",
    "a cut ELF file": "payload = cache.load(key, parts)[:200]",
    "a damaged symbol table": "payload = bytearray(cache.load(key, parts)); "
                              "payload[0x28:0x30] = (2**40).to_bytes(8, 'little')",
    "a Mach-O header": "payload = b'\\xcf\\xfa\\xed\\xfe' + bytes(60)",
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_cached_payload_that_is_not_the_kernels_code_is_compiled_again(damage, child):
    first = child.run(SETUP + """
    f(x); g(x)
    key, parts = entry(f)
    """ + DAMAGE[damage] + """
    cache.store(key, parts, bytes(payload))  # a well-formed entry around a bad payload
    print("STORED")
    """)
    assert first.returncode == 0 and "STORED" in first.stdout, first.stderr
    check = SETUP + """
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = f(x)
    print("RIGHT" if np.allclose(out, np.exp(x) * 2 + 1, rtol=1e-6) else "WRONG")
    print("HIT", [k.cache_hit for k in f.lower(x).kernels])
    print("WARNINGS", [str(w.message) for w in seen if issubclass(w.category, cache.CacheWarning)])
    """
    second, third = child.run(check), child.run(check)
    for r in (second, third):
        assert r.returncode == 0, (r.returncode, r.stderr)
        assert "RIGHT" in r.stdout
    assert "cannot be linked" in second.stdout and "HIT [False]" in second.stdout, second.stdout
    assert "WARNINGS []" in third.stdout and "HIT [True]" in third.stdout, third.stdout
