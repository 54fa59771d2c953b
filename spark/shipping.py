"""delayq's own code for a cluster's executors: zipped from this interpreter's delayq and shipped with the job.

On a cluster the executors' Python workers parse the buffer with the nodes' parser
(records.py): they import ``delayq.spark.records`` and ``delayq.wire``. The job ships that
code itself, as a user's job ships its own: a zip of the ``delayq`` package's modules and of
the ``delayq.spark`` package, taken from wherever this interpreter imports them
(site-packages, or the source tree of an editable install), added to the session with
``SparkContext.addPyFile``. Each executor fetches it from the driver and puts it ahead of
site-packages on its Python workers' path, so the executors run the driver's delayq, whatever
is installed there (or nothing): they need only the libraries that code imports, pyarrow as
every PySpark job with Arrow does.

The zip is named by a digest of what it holds, in ``<cache>/spark/py-files/``: the same code
is zipped once, and an edited source tree ships a zip of its own name (an executor keeps the
files of one name it fetched).
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

# What the executors import: delayq's own modules (wire, clock, schedule, features, errors, ...), whose
# folder in an installed wheel also holds every part (only its files are taken), and the job's package.
# spark/ imports no other part of delayq (docs/parts_map.py, checked by tests/unit/test_parts_map.py).
SHIPPED_PACKAGES = ("delayq", "delayq.spark")
FOLDER = "py-files"


def package_files() -> dict[str, Path]:
    """Every file to ship, by its name inside the zip (``delayq/wire.py``, ``delayq/spark/records.py``, ...).

    The ``delayq`` package contributes the files of its own folder, ``delayq.spark`` its whole
    folder; compiled caches are left out (each Python compiles its own).
    """
    import importlib

    found: dict[str, Path] = {}
    for name in SHIPPED_PACKAGES:
        package = importlib.import_module(name)
        folder = Path(next(iter(package.__path__)))
        inside = name.replace(".", "/")
        recursive = name != "delayq"
        for path in sorted(folder.rglob("*") if recursive else folder.iterdir()):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                found[f"{inside}/{path.relative_to(folder).as_posix()}"] = path
    return found


def code_zip(cache: Path) -> Path:
    """The zip of :func:`package_files` in ``cache``/py-files, made if no zip of the same contents is there.

    Returns:
        its path, ``delayq-<version>-<digest of the contents>.zip``.
    """
    from delayq import __version__

    files = package_files()
    digest = hashlib.sha256()
    for name, path in files.items():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = cache / FOLDER / f"delayq-{__version__}-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(scratch, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, path in files.items():
                # A fixed time: the same files give the same bytes.
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, path.read_bytes())
        scratch.replace(target)
    finally:
        scratch.unlink(missing_ok=True)
    return target
