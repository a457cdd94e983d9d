"""Rate limits: a fixed one-minute window per caller, counted in the shared cache."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import cache
from redis.exceptions import RedisError
from rest_framework.throttling import BaseThrottle

from lab.models import ApiKey

_WINDOW_S = 60
logger = logging.getLogger(__name__)


def over_limit(bucket: str, limit: int) -> tuple[bool, float]:
    """Count one request in ``bucket``'s current minute; return (over ``limit``?, seconds left).

    Fails open: when the cache (Redis) cannot be reached the request is allowed and a warning
    logged, so an outage of the cache never stops the API or engines' reports.
    """
    now = time.time()
    window = int(now // _WINDOW_S)
    cache_key = f"ratelimit:{bucket}:{window}"
    try:
        # add() is atomic: only the first request of a window creates the counter.
        if cache.add(cache_key, 1, timeout=_WINDOW_S * 2):
            count = 1
        else:
            try:
                count = cache.incr(cache_key)
            except ValueError:  # expired between add() and incr()
                cache.add(cache_key, 1, timeout=_WINDOW_S * 2)
                count = 1
    except (RedisError, OSError) as exc:
        logger.warning("rate limit not counted, the cache is unreachable: %s", exc)
        return False, 0.0
    return count > limit, (window + 1) * _WINDOW_S - now


class ApiKeyRateThrottle(BaseThrottle):
    """Allow ``LAB_API_RATE_LIMIT_PER_MINUTE`` requests per API key per minute; then 429 + Retry-After."""

    def allow_request(self, request, view) -> bool:
        api_key = request.auth
        if not isinstance(api_key, ApiKey):
            return True
        limited, self._wait = over_limit(f"key:{api_key.public_id}", settings.LAB_API_RATE_LIMIT_PER_MINUTE)
        return not limited

    def wait(self) -> float:
        return self._wait
