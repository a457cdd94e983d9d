"""Exponential lockout for the sign-in, password-reset and sign-up forms.

Each action counts attempts (failed sign-ins; every password-reset request and sign-up) per
account or email and per client address in the shared cache (Redis in production). After an
action's free attempts, the key is locked out for the first lockout; every further attempt, once
the lockout is over, doubles it up to the cap. An hour without attempts forgets them. While any of
an action's keys is locked out, the attempt is refused before anything is checked (a sign-in with
the right password included), with :class:`LockedOut`.

The client address is the request's ``REMOTE_ADDR``: behind a reverse proxy, uvicorn's
``--forwarded-allow-ips`` (``FORWARDED_ALLOW_IPS``) makes it the client's. An IPv6 client counts
as its /64 network, since one host commonly holds a whole /64.

Like the API's rate limits, the lockout fails open: with the cache unreachable nothing is counted
and a warning is logged, so a cache outage does not stop people signing in. Attempts already in
flight when a lockout begins still finish (at most the number of concurrent requests).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from dataclasses import dataclass

from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from redis.exceptions import RedisError

from lab.ids import sha256_hex

logger = logging.getLogger(__name__)

#: Attempts are forgotten after this many seconds without one (longer than any lockout).
MEMORY_S = 3600


@dataclass(frozen=True)
class Limit:
    """How many attempts one key (``scope``: ``account``, ``email`` or ``address``) gets before a
    lockout of ``first_lockout_s`` seconds, doubling with each further attempt up to ``max_lockout_s``."""

    scope: str
    free_attempts: int
    first_lockout_s: int
    max_lockout_s: int

    def lockout_s(self, attempts: int) -> int:
        """Return the lockout after ``attempts`` counted attempts (0 while some are still free)."""
        if attempts < self.free_attempts:
            return 0
        doublings = min(attempts - self.free_attempts, 32)
        return min(self.max_lockout_s, self.first_lockout_s * 2**doublings)


@dataclass(frozen=True)
class Action:
    """A throttled form: its name in cache keys, the refusal's first sentence, and its limits."""

    name: str
    refusal: str
    limits: tuple[Limit, ...]


LOGIN = Action(
    "login",
    "Too many failed sign-in attempts.",
    (Limit("account", 5, 30, 900), Limit("address", 20, 30, 900)),
)
PASSWORD_RESET = Action(
    "password_reset",
    "Too many password reset requests.",
    (Limit("email", 3, 60, MEMORY_S), Limit("address", 10, 60, MEMORY_S)),
)
SIGN_UP = Action("sign_up", "Too many sign-ups from your network.", (Limit("address", 10, 60, MEMORY_S),))


class LockedOut(Exception):
    """An attempt refused because one of its keys is locked out for ``retry_after_s`` more seconds."""

    def __init__(self, action: Action, retry_after_s: int):
        self.action = action
        self.retry_after_s = retry_after_s
        super().__init__(self.message)

    @property
    def message(self) -> str:
        """What the page says: the action's refusal and when to try again."""
        return f"{self.action.refusal} Try again in {_duration(self.retry_after_s)}."


def _now() -> float:
    return time.time()


def _duration(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def client_address(request: HttpRequest | None) -> str:
    """Return the address ``request`` came from as counted here: IPv4 as is, IPv6 as its /64."""
    raw = (request.META.get("REMOTE_ADDR") or "") if request is not None else ""
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return raw[:64]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _cache_keys(action: Action, limit: Limit, value: str) -> tuple[str, str, str]:
    """Return the (attempts, last attempt, locked until) cache keys of one value; values are hashed
    so that no email or address is stored in the cache."""
    base = f"lockout:{action.name}:{limit.scope}:{sha256_hex(value.strip().lower())[:32]}"
    return f"{base}:attempts", f"{base}:seen", f"{base}:until"


def _keyed_limits(action: Action, values: dict[str, str]) -> list[tuple[Limit, str]]:
    return [(limit, values[limit.scope]) for limit in action.limits if values.get(limit.scope)]


def check(action: Action, **values: str) -> None:
    """Raise LockedOut when any of ``action``'s keys (``account=``, ``email=``, ``address=``) is
    locked out; count nothing."""
    keyed = _keyed_limits(action, values)
    until_keys = [_cache_keys(action, limit, value)[2] for limit, value in keyed]
    if not until_keys:
        return
    try:
        locked_until = cache.get_many(until_keys)
    except (RedisError, OSError) as exc:
        logger.warning("lockout not checked, the cache is unreachable: %s", exc)
        return
    wait = max((until - _now() for until in locked_until.values()), default=0.0)
    if wait > 0:
        raise LockedOut(action, math.ceil(wait))


def record(action: Action, **values: str) -> None:
    """Count one attempt against each of ``action``'s keys, locking out those past their free
    attempts (the counter is an atomic increment, so concurrent attempts are all counted)."""
    now = _now()
    for limit, value in _keyed_limits(action, values):
        attempts_key, seen_key, until_key = _cache_keys(action, limit, value)
        try:
            last_seen = cache.get(seen_key)
            if last_seen is not None and now - last_seen > MEMORY_S:
                cache.delete(attempts_key)
            cache.add(attempts_key, 0, timeout=MEMORY_S)
            try:
                attempts = cache.incr(attempts_key)
            except ValueError:  # expired between add() and incr()
                cache.add(attempts_key, 1, timeout=MEMORY_S)
                attempts = 1
            cache.touch(attempts_key, MEMORY_S)
            cache.set(seen_key, now, timeout=MEMORY_S)
            lockout_s = limit.lockout_s(attempts)
            if lockout_s:
                cache.set(until_key, now + lockout_s, timeout=MEMORY_S)
        except (RedisError, OSError) as exc:
            logger.warning("lockout attempt not counted, the cache is unreachable: %s", exc)
            return


def attempt(action: Action, **values: str) -> None:
    """Check ``action``'s keys, then count this attempt (for actions where every attempt counts:
    password-reset requests, sign-ups). Raises LockedOut, counting nothing, when locked out."""
    check(action, **values)
    record(action, **values)


def clear(action: Action, **values: str) -> None:
    """Forget the attempts and lockouts of the given keys (a successful sign-in clears its account's)."""
    keys = [key for limit, value in _keyed_limits(action, values) for key in _cache_keys(action, limit, value)]
    try:
        cache.delete_many(keys)
    except (RedisError, OSError) as exc:
        logger.warning("lockout not cleared, the cache is unreachable: %s", exc)


class LockoutAuthenticationMixin:
    """Mix into an AuthenticationForm: refuse a sign-in while its account or client address is
    locked out, before the password is checked; count each failure; a success forgets the
    account's failures. ``locked_out`` keeps the refusal for the view (which answers 429)."""

    locked_out: LockedOut | None = None

    def clean(self):
        email = (self.cleaned_data.get("username") or "").strip().lower()
        if not email:
            return super().clean()
        keys = {"account": email, "address": client_address(self.request)}
        try:
            check(LOGIN, **keys)
        except LockedOut as refusal:
            self.locked_out = refusal
            raise ValidationError(refusal.message, code="locked_out") from None
        try:
            cleaned_data = super().clean()
        except ValidationError:
            record(LOGIN, **keys)
            raise
        clear(LOGIN, account=email)
        return cleaned_data
