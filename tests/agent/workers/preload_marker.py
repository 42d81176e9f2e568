"""A module to preload: importing it is what the template does (tests look for it)."""

IMPORTED = True
