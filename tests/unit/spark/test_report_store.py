"""The report written to an object store: a real S3 endpoint (moto's server on loopback) and file:// URLs.

The S3 client is pyarrow's own (the AWS C++ SDK), configured only by the environment a pod gets from the
chart: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from delayq import Settings
from delayq.spark import ANOMALY_KINDS
from delayq.spark.destination import parse_out, report_folder
from delayq.spark.report import build_report, write_outputs

from .test_reconcile_report import SCHEMA, anomaly, findings, options

BUCKET = "delayq-reports"


@pytest.fixture(scope="module")
def s3_endpoint():
    """An S3 endpoint on a loopback port the kernel picks, with one bucket; stopped after the module."""
    from moto.server import ThreadedMotoServer

    # One log line per request would bury a failure's own output.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    admin = pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1",
                              endpoint_override=endpoint, allow_bucket_creation=True)
    admin.create_dir(BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch) -> pafs.S3FileSystem:
    """The environment the chart gives the reconcile container; returns a client to read back what was written."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1", endpoint_override=s3_endpoint)


def report_with_anomalies(tmp_path: Path):
    rows = [anomaly("missing-1", flag="is_missing"), anomaly("dup-1", flag="is_duplicate", copies=2, first=1)]
    chosen = options(tmp_path)
    return build_report(findings(rows, missing=1, duplicates=1), Settings(), chosen), \
        pa.Table.from_pylist(rows, schema=SCHEMA)


def test_a_report_written_to_an_s3_url_reads_back_whole_from_the_bucket(s3_env, tmp_path):
    report, table = report_with_anomalies(tmp_path)
    url = f"s3://{BUCKET}/orders/20270115T080000Z"

    written = write_outputs(report, table, url)

    document = json.loads(s3_env.open_input_stream(f"{BUCKET}/orders/20270115T080000Z/report.json").read())
    assert document["totals"]["missing"] == 1 and document["exit_code"] == 1
    assert document["files"]["json"] == f"{url}/report.json"
    assert written.files["anomalies_missing"] == f"{url}/anomalies/missing.parquet"
    missing = pq.read_table(f"{BUCKET}/orders/20270115T080000Z/anomalies/missing.parquet", filesystem=s3_env)
    assert missing.column("id").to_pylist() == ["missing-1"]
    for kind in ANOMALY_KINDS:
        assert s3_env.get_file_info(f"{BUCKET}/orders/20270115T080000Z/anomalies/{kind}.parquet").size > 0, kind
    with s3_env.open_input_stream(f"{BUCKET}/orders/20270115T080000Z/report.html") as page:
        # A browser opening the object from the bucket shows the page, not a download.
        assert page.metadata()["Content-Type"] == b"text/html; charset=utf-8"
        assert b"missing-1" in page.read()


def test_the_s3_specific_endpoint_variable_is_read_too(s3_env, s3_endpoint, tmp_path, monkeypatch):
    report, table = report_with_anomalies(tmp_path)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)

    # AWS_ENDPOINT_URL_S3 (pyarrow 16+) is the AWS SDKs' service-specific form of AWS_ENDPOINT_URL.
    write_outputs(report, table, f"s3://{BUCKET}/s3-specific/")

    assert s3_env.get_file_info(f"{BUCKET}/s3-specific/report.json").type == pafs.FileType.File


def test_a_bucket_that_does_not_exist_fails_before_anything_is_written_naming_the_url_and_what_to_check(
        s3_env, tmp_path):
    report, table = report_with_anomalies(tmp_path)

    with pytest.raises(OSError) as raised:
        write_outputs(report, table, "s3://no-such-bucket/reports/run-1")

    assert "cannot write the report to s3://no-such-bucket/reports/run-1" in str(raised.value)
    assert "AWS_ENDPOINT_URL" in str(raised.value) and "bucket exists" in str(raised.value)
    assert not report.files


def test_a_file_url_writes_a_local_folder(tmp_path):
    report, table = report_with_anomalies(tmp_path)
    folder = tmp_path / "by-url" / "run-1"

    written = write_outputs(report, table, f"file://{folder}")

    assert json.loads((folder / "report.json").read_text())["totals"]["duplicates"] == 1
    assert pq.read_table(folder / "anomalies" / "duplicates.parquet").column("id").to_pylist() == ["dup-1"]
    assert written.files["html"] == f"file://{folder}/report.html"


def test_a_local_folder_is_written_and_named_as_before(tmp_path):
    report, table = report_with_anomalies(tmp_path)

    written = write_outputs(report, table, tmp_path / "plain")

    assert written.files["json"] == str(tmp_path / "plain" / "report.json")
    assert written.files["anomalies_missing"] == str(tmp_path / "plain" / "anomalies" / "missing.parquet")
    assert (tmp_path / "plain" / "report.html").is_file()


@pytest.mark.parametrize("text,parsed", [
    ("reports/today", Path("reports/today")),
    ("/var/delayq/reports", Path("/var/delayq/reports")),
    ("s3://bucket/delayq/run-1", "s3://bucket/delayq/run-1"),
    ("s3://bucket/delayq/", "s3://bucket/delayq"),
    ("s3://bucket", "s3://bucket"),
    ("s3://bucket/prefix/?region=eu-west-1", "s3://bucket/prefix?region=eu-west-1"),
    ("gs://bucket/reports", "gs://bucket/reports"),
    ("file:///var/delayq/reports", "file:///var/delayq/reports"),
])
def test_out_is_a_local_path_or_an_object_store_url(text, parsed):
    assert parse_out(text) == parsed


@pytest.mark.parametrize("text,says", [
    ("http://minio:9000/bucket", "http:// is no object store the report can be written to"),
    ("s3:///prefix", "the URL names no bucket"),
    ("s3://", "the URL names no bucket"),
    ("file://reports", "a file:// URL names an absolute folder"),
    ("file:///", "a file:// URL names an absolute folder"),
])
def test_an_out_url_the_report_cannot_go_to_is_refused_with_a_form_that_works(text, says):
    with pytest.raises(ValueError) as raised:
        parse_out(text)

    assert str(raised.value).startswith(f"--out {text}: {says}")
    assert "://" in str(raised.value).split(says, 1)[1]  # and an example URL


def test_opening_a_folder_writes_nothing_until_it_is_created(tmp_path):
    folder = report_folder(tmp_path / "later")

    assert not (tmp_path / "later").exists()
    folder.create()
    assert (tmp_path / "later" / "anomalies").is_dir()
