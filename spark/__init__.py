"""delayq.spark: the reconciliation job, proof that every delayed message was delivered once, on time.

A PySpark batch job reads the buffer topic and the target topics straight from
Kafka (Spark's own Kafka source), judges every delay id due in a time window, and
writes report.json, report.html and anomalies/*.parquet. ``delayq reconcile`` runs
it on ``local[*]``; ``python -m delayq.spark`` is the same job for spark-submit
(see spark/README.md).

Public surface::

    from delayq.spark import reconcile, ReconcileOptions, Report

    report = reconcile(Settings(), ReconcileOptions(since_ms=..., until_ms=..., out=Path("report")))
    sys.exit(report.exit_code)      # 0: no anomaly of any kind (ANOMALY_KINDS)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import ReconcileOptions, iso, parse_instant
from .report import ANOMALY_KINDS, Report, load_report
from .session import ReconcileError, kafka_package, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from delayq import Settings

    from .job import Progress


def reconcile(settings: Settings, options: ReconcileOptions, *, spark: SparkSession | None = None,
              progress: Progress | None = None) -> Report:
    """Reconcile the buffer topic of ``settings`` against its target topics and write the report.

    Args:
        settings: Kafka address and pass-through client settings, and the buffer topic.
        options: the window, grace, tolerance, target topics, isolation level and output folder.
        spark: a session to use; None takes the active one or starts one (``options.master``).
        progress: called with a short text as each step of the run starts.

    Returns:
        The report; its files are in ``options.out`` and ``report.exit_code`` is 0 when no
        message is missing, duplicated, early or unexpected, no cancel or reschedule was ignored,
        and no producer's writes were reordered (a write appended twice is counted, not failed).

    Raises:
        ReconcileError: Kafka did not answer, the buffer topic does not exist, or Spark could not start.
    """
    from .destination import report_folder
    from .job import reconcile_findings
    from .report import build_report, write_outputs

    if isinstance(options.out, str):  # an object store: a wrong bucket or credentials fail now, not after the job
        try:
            report_folder(options.out).create()
        except OSError as err:
            raise ReconcileError(str(err)) from err
    findings = reconcile_findings(settings, options, spark=spark, progress=progress)
    if progress is not None:
        progress(f"writing the report to {options.out}")
    report = build_report(findings, settings, options)
    return write_outputs(report, findings.anomalies, options.out)


__all__ = [
    "ANOMALY_KINDS",
    "ReconcileError",
    "ReconcileOptions",
    "Report",
    "iso",
    "kafka_package",
    "load_report",
    "parse_instant",
    "reconcile",
    "spark_session",
]
