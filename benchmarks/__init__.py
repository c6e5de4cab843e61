"""The benchmarks: scripts a user or a developer runs, ``python -m benchmarks NAME [ARGS]``.

Not installed with autoplace (``pyproject.toml`` packages only ``autoplace*``); run from a clone's
root. ``python -m benchmarks`` lists them; ``benchmarks/README.md`` says what each prints.
"""
