"""Template of an area (files starting with ``_`` are not run): see ``scripts/reference_max.py``."""
