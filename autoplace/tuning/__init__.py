"""Tuned kernels: MetaSchedule campaigns over the kernels a build compiles for each device, and
the records a build applies.

>>> report = autoplace.tune(mod, devices, db="prof.db", trials=64)     # doctest: +SKIP
>>> res = autoplace.optimize(mod, devices, db="prof.db")               # doctest: +SKIP
>>> res.kernels                                                        # doctest: +SKIP
{'tuned': 12, 'default': 3}
"""

from autoplace.tuning.tuner import KernelStatus, TuneReport, describe, device_kernels, tune
from autoplace.tuning.records import open_records, records_root, shipped_store

__all__ = ["KernelStatus", "TuneReport", "describe", "device_kernels", "open_records",
           "records_root", "shipped_store", "tune"]
