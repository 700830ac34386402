"""Human-readable reports, pure formatting of figures already computed: a run's headline and paired differences
(`run.py`: terminal and markdown) and the nightly check's markdown (`nightly.py`). Writing them anywhere (a Prefect
artifact, the terminal, an MLflow run) is the caller's side effect."""
