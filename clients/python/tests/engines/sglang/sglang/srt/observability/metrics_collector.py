"""Stand-in of sglang.srt.observability.metrics_collector: the StorageMetrics a backend's
get_stats() returns, and what the collector does with it (ignore None; otherwise require a
StorageMetrics and observe each of its samples)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


class StorageMetricsCollector:
    """Keeps what it observed (SGLang feeds Prometheus histograms)."""

    SAMPLES = ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")

    def __init__(self):
        self.observed: dict = {name: [] for name in self.SAMPLES}

    def log_storage_metrics(self, storage_metrics: Optional[StorageMetrics] = None) -> None:
        if storage_metrics is None:
            return
        assert isinstance(storage_metrics, StorageMetrics)
        for name in self.SAMPLES:
            self.observed[name].extend(getattr(storage_metrics, name))
