"""Where a report is written: a local folder, or a folder in an object store named by a URL (``s3://bucket/prefix``).

A URL is opened with ``pyarrow.fs.FileSystem.from_uri``, so the object store's own configuration applies as its
SDK reads it. For S3: credentials from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (else ~/.aws, a web
identity token, the instance's role), and an S3-compatible store's endpoint from ``AWS_ENDPOINT_URL``
(``AWS_ENDPOINT_URL_S3`` first, pyarrow 16+), e.g. ``http://minio.storage:9000``; without an endpoint the
bucket's region is asked of AWS. Options pyarrow reads from the URL's query go through too
(``s3://bucket/prefix?region=eu-west-1``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import pyarrow.fs as pafs

# The URL schemes pyarrow.fs opens as folders; "file" is a local absolute path.
STORE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs", "file")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def parse_out(text: str | Path) -> Path | str:
    """Where ``--out`` points: a URL of an object store stays a string (without a trailing '/'), else a local Path.

    Only the text is checked (no network): a wrong bucket or missing credentials show when the folder is
    made (:meth:`ReportFolder.create`).

    Raises:
        ValueError: a URL whose scheme pyarrow cannot write to, or one that names no bucket (or no path, for
            ``file://``); the message gives a form that works.
    """
    if isinstance(text, Path):
        return text
    match = _URL.match(text)
    if match is None:
        return Path(text)
    scheme = match.group(1).lower()
    if scheme not in STORE_SCHEMES:
        raise ValueError(f"--out {text}: {scheme}:// is no object store the report can be written to; give a "
                         f"folder, or a URL of {', '.join(s + '://' for s in STORE_SCHEMES)}, "
                         "e.g. s3://bucket/delayq/reports")
    parts = urlsplit(text)
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.path == "/":
            raise ValueError(f"--out {text}: a file:// URL names an absolute folder, e.g. file:///var/delayq/reports")
    elif not parts.netloc:
        raise ValueError(f"--out {text}: the URL names no bucket (or container, or host), e.g. "
                         f"{scheme}://bucket/delayq/reports")
    url, sep, query = text.partition("?")
    return url.rstrip("/") + sep + query


@dataclass(frozen=True)
class ReportFolder:
    """One report's folder: ``path`` inside ``filesystem``, shown to people as ``location`` (the folder or URL given).

    Made by :func:`report_folder`.
    """

    filesystem: pafs.FileSystem
    path: str
    location: str

    def file(self, *names: str) -> tuple[str, str]:
        """(path in the filesystem, path or URL it is shown by) of a file under the folder."""
        if "://" not in self.location:
            return str(Path(self.path, *names)), str(Path(self.location, *names))
        inner = "/".join(names)
        return f"{self.path}/{inner}", f"{self.location.partition('?')[0]}/{inner}"

    def create(self) -> None:
        """Make the folder and its ``anomalies/``: in an object store, the first request, so a wrong bucket,
        credentials or endpoint show here, before any report file is written.

        Raises:
            OSError: the folder cannot be made; the message names the location and, for a URL, what to check.
        """
        try:
            self.filesystem.create_dir(self.file("anomalies")[0], recursive=True)
        except OSError as err:
            hint = ("" if "://" not in self.location else
                    "; check that the bucket exists and that the credentials given (for S3: AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL for an S3-compatible store) may write to it")
            raise OSError(f"cannot write the report to {self.location}: {err}{hint}") from err

    def write_text(self, name: str, text: str, content_type: str) -> str:
        """Write one text file into the folder (its Content-Type, in an object store); return where it is shown."""
        path, shown = self.file(name)
        with self.filesystem.open_output_stream(path, compression=None,
                                                metadata={"Content-Type": content_type}) as stream:
            stream.write(text.encode("utf-8"))
        return shown


def report_folder(out: Path | str) -> ReportFolder:
    """The folder ``out`` names (a local path, or a URL :func:`parse_out` accepts), opened with pyarrow.fs.

    Nothing is written until :meth:`ReportFolder.create`; opening an S3 URL without an endpoint asks AWS for
    the bucket's region.

    Raises:
        ValueError: as :func:`parse_out`.
        OSError: pyarrow cannot open the store (e.g. an S3 bucket's region could not be asked).
    """
    import pyarrow.fs as pafs

    out = parse_out(out)
    if isinstance(out, Path):
        return ReportFolder(pafs.LocalFileSystem(), str(out), str(out))
    try:
        filesystem, path = pafs.FileSystem.from_uri(out)
    except OSError as err:
        raise OSError(f"cannot open {out} to write the report: {err}") from err
    return ReportFolder(filesystem, path.rstrip("/"), out)
