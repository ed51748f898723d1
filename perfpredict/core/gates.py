"""The CPU timing gate of shared/notes/cpu-measurement.md, shared by collect (which retries a disturbed run) and
train (which keeps only undisturbed step times as labels): calibration workload slowed past 1.12x its baseline, or
more than 0.3 cores of other work beside the run.

Its own module without polars (core.dataset re-exports it): the collect workers import it on machines where only
torch and the trainers are installed (a lent GPU machine, benchmarks/device/h200_session.sh)."""

CALIB_RATIO_MAX = 1.12
OTHER_LOAD_MAX_CORES = 0.3
