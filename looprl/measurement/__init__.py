"""Measuring kernels: timing, the host's peak, numpy's baseline, the machine-wide lock,
the persistent cache and the evaluator that ranks many schedules.

Imports nothing of gymnasium, Ray or torch (checked by the layering contract in pyproject)."""

from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator, Measurement, measure
from looprl.measurement.peak import peak_gflops

__all__ = ["Evaluator", "Measurement", "MeasurementCache", "measure", "peak_gflops"]
