"""The Verifier: build, check and time a candidate against its PyTorch reference."""

from stitchcuda.verify.config import PRESETS, TOLERANCES, Tolerance, VerifyConfig
from stitchcuda.verify.runner import DeviceUnavailable, Verifier
from stitchcuda.verify.verdict import Verdict

__all__ = ["DeviceUnavailable", "PRESETS", "TOLERANCES", "Tolerance", "Verdict", "Verifier", "VerifyConfig"]
