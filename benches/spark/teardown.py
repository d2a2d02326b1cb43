"""Stopping a benchmark's Spark for good.

`spark.stop()` leaves the py4j gateway JVM to exit once Python does, and
that JVM first finishes the jobs still running: a 10 M-key RocksDB batch
that the query's stop could not cancel kept one busy on a core for 20
minutes, beside the benchmarks that ran after it. So the JVM is killed
once the session is stopped; every result is written by then.
"""


def stop(spark):
    """Stops `spark`, then kills its gateway JVM."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    try:
        spark.stop()
    finally:
        proc = getattr(gateway, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
