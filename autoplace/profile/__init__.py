"""Profiling: time single-op workloads and device-to-device copies on real devices, into a store."""

from autoplace.profile.campaign import (
                                        CampaignReport,
                                        as_runner,
                                        collect,
                                        run_campaign,
                                        runner_from_spec,
)
from autoplace.profile.links import copy_times, fit_link
from autoplace.profile.measure import (
                                        DeviceUnavailable,
                                        LocalRunner,
                                        OpFailed,
                                        TimingPolicy,
                                        check_present,
                                        fingerprint,
)
from autoplace.profile.measurements import (
                                        OVERHEAD_KINDS,
                                        LinkFit,
                                        Measurement,
                                        OverheadFit,
                                        ProfileStoreError,
)
from autoplace.profile.profiles import DeviceProfile, shipped_dir
from autoplace.profile.store import ProfileStore
from autoplace.profile.workload import single_op_modules

__all__ = [
    "OVERHEAD_KINDS", "CampaignReport", "DeviceProfile", "DeviceUnavailable", "LinkFit",
    "LocalRunner", "Measurement", "OpFailed", "OverheadFit", "ProfileStore", "ProfileStoreError",
    "TimingPolicy", "as_runner", "check_present", "collect", "copy_times", "fingerprint",
    "fit_link", "run_campaign", "runner_from_spec", "shipped_dir", "single_op_modules",
]
