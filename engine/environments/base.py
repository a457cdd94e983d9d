"""The environment protocol, as the engine's modules import it.

It is defined once, in the ``lab-environments`` distribution (``sdk/lab-environments``, the
package ``lab_environments``: standard library only), which environment packages depend on and
Lab's engine and server import; the names are re-exported here unchanged.
"""

from __future__ import annotations

from lab_environments import (
    EVAL_BUCKET,
    MAX_SPLIT_DRAWS,
    SPLIT_BUCKETS,
    SPLITS,
    VAL_BUCKET,
    Environment,
    EnvironmentFailed,
    EnvironmentInfo,
    Example,
    InvalidEnvironment,
    RewardFunction,
    Scores,
    retry_allowed,
    split_of,
)

__all__ = [
    "EVAL_BUCKET", "MAX_SPLIT_DRAWS", "SPLITS", "SPLIT_BUCKETS", "VAL_BUCKET", "Environment", "EnvironmentFailed",
    "EnvironmentInfo", "Example", "InvalidEnvironment", "RewardFunction", "Scores", "retry_allowed", "split_of",
]
