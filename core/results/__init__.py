"""Results: what a run records and how it is summarised, compared and shown.

- `metrics.py` (the names below), `collector.py` (what a run records), `summaries.py` (latency
  distributions, throughputs), `fairness.py` (per-window Jain's index), `horizon.py` (warm-up and
  horizon of the measurement);
- `document.py` (the JSON result document), `files.py` (JSON and CSV files);
- `stats.py` (bootstrap intervals, verdicts), `paired.py` (comparisons over seeds);
- `report.py`, `report_numbers.py` (terminal tables), `progress.py` (progress bars).
"""
