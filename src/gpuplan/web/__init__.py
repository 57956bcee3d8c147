"""``gpuplan web``: a planning page and JSON API over the same library calls as the CLI.

Needs the optional extra ``web`` (FastAPI, uvicorn). The API answers exactly
what the CLI's ``--json`` prints; pages are server-rendered HTML with a little
vanilla JavaScript and no external resource. See ``docs/web.md``.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'gpuplan[web]'"
