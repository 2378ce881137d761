"""The batching predictor's counters in the Prometheus text format (prometheus_client's own
families and writer).

  tfdist_requests_total{model, code}        HTTP responses, by status code
  tfdist_batches_total{model, batch_size}   batches run, by (padded) size: the histogram
  tfdist_rows_total, tfdist_padding_rows_total, tfdist_rejected_total, tfdist_expired_total
  tfdist_queue_depth                         requests waiting after the last batch
  tfdist_queue_wait_seconds                  quantiles of the last 4,096 requests' wait
  tfdist_run_seconds_total                   time in the model
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily


def text(stats, model: str, responses: Mapping[int, int] | None = None) -> bytes:
  """The exposition of `stats` (a `batching.Stats`) for `model`, with the HTTP `responses`
  counted by status code."""
  registry = CollectorRegistry()
  registry.register(_Collector(stats, model, dict(responses or {})))
  return generate_latest(registry)


class _Collector:
  def __init__(self, stats, model: str, responses: dict[int, int]):
    self.stats, self.model, self.responses = stats, model, responses

  def collect(self):
    stats, model = self.stats, self.model
    requests = CounterMetricFamily("tfdist_requests", "HTTP responses, by status code.",
                                   labels=["model", "code"])
    for code, count in sorted(self.responses.items()):
      requests.add_metric([model, str(code)], count)
    yield requests
    batches = CounterMetricFamily("tfdist_batches", "Batches run, by padded batch size.",
                                  labels=["model", "batch_size"])
    for size, count in sorted(stats.batches.items()):
      batches.add_metric([model, str(size)], count)
    yield batches
    for name, value, text in (
        ("tfdist_rows", stats.rows, "Rows predicted."),
        ("tfdist_padding_rows", stats.padding, "Rows of padding up to an allowed batch size."),
        ("tfdist_rejected", stats.rejected, "Requests refused with a full queue."),
        ("tfdist_expired", stats.expired, "Requests whose deadline passed before they ran."),
        ("tfdist_run_seconds", stats.run_seconds, "Seconds spent running batches.")):
      family = CounterMetricFamily(name, text, labels=["model"])
      family.add_metric([model], value)
      yield family
    depth = GaugeMetricFamily("tfdist_queue_depth", "Requests waiting after the last batch.",
                              labels=["model"])
    depth.add_metric([model], stats.queue_depth)
    yield depth
    waits = np.array(stats.queue_wait or [0.0])
    wait = SummaryMetricFamily("tfdist_queue_wait_seconds",
                               "Time requests waited in the queue (the last 4,096).",
                               labels=["model"])
    wait.add_metric([model], count_value=len(stats.queue_wait), sum_value=float(waits.sum()))
    yield wait
    quantiles = GaugeMetricFamily("tfdist_queue_wait_seconds_quantile",
                                  "Quantiles of the queue wait (the last 4,096 requests).",
                                  labels=["model", "quantile"])
    for q in (0.5, 0.99):
      quantiles.add_metric([model, str(q)], float(np.quantile(waits, q)))
    yield quantiles
