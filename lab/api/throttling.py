"""Per-API-key rate limit: a fixed one-minute window counted in the shared cache."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import BaseThrottle

from lab.models import ApiKey

_WINDOW_S = 60


class ApiKeyRateThrottle(BaseThrottle):
    """Allow ``LAB_API_RATE_LIMIT_PER_MINUTE`` requests per key per minute; then 429 + Retry-After."""

    def allow_request(self, request, view) -> bool:
        api_key = request.auth
        if not isinstance(api_key, ApiKey):
            return True
        now = time.time()
        window = int(now // _WINDOW_S)
        cache_key = f"ratelimit:{api_key.public_id}:{window}"
        # add() is atomic: only the first request of a window creates the counter.
        if cache.add(cache_key, 1, timeout=_WINDOW_S * 2):
            count = 1
        else:
            try:
                count = cache.incr(cache_key)
            except ValueError:
                cache.add(cache_key, 1, timeout=_WINDOW_S * 2)
                count = 1
        self._wait = (window + 1) * _WINDOW_S - now
        return count <= settings.LAB_API_RATE_LIMIT_PER_MINUTE

    def wait(self) -> float:
        return self._wait
