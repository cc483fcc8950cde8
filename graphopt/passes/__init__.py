"""Passes that rewrite a Graph (the pass manager, DCE, CSE, folding, fusion) live here."""
