"""Per-source readers used by ``scripts/build_offerings.py``.

Each module turns one kind of reference file into offering rows (plain dicts in
the field order of ``gpuplan.catalog.schema.Offering``). Nothing here is
imported by the ``gpuplan`` library; the package sits beside the script so the
script stays short (STYLE.md §4.3, 500-line soft limit).
"""
