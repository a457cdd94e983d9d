"""Job secrets: write-only ``NAME=value`` pairs given beside a spec, kept encrypted, passed only
to that job's engine process (:mod:`jobs.secrets.services`)."""
