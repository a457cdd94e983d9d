"""The orphan sweep: engine processes (or JobSets) no attempt accounts for are ended."""

from __future__ import annotations

import logging

from jobs.launchers.base import Launcher
from jobs.models import AttemptState, JobAttempt

logger = logging.getLogger(__name__)


def sweep_orphans(launcher: Launcher, parked: list[dict]) -> None:
    """End what ``launcher`` runs that belongs to no launched attempt, nor to the JobSets
    ``parked`` in Kueue (their handles), logging each."""
    live = list(JobAttempt.objects.filter(state=AttemptState.LAUNCHED).values_list("handle", flat=True))
    for workdir in launcher.sweep_orphans(live + parked):
        logger.warning("ended an orphan engine process", extra={"workdir": workdir})
