"""Exponential lockout for the sign-in, password-change, password-reset and sign-up forms.

Each action counts attempts (sign-ins and password changes that fail; every password-reset
request and sign-up) per account or email and per client address in the shared cache (Redis in
production). After an action's free attempts, the key is locked out for the first lockout; every
further attempt, once the lockout is over, doubles it up to the cap. An hour without attempts
forgets them (the counter's time to live). While any of an action's keys is locked out, the
attempt is refused before anything is checked (a sign-in with the right password included), with
:class:`LockedOut`.

An attempt is counted before it is checked (:func:`begin`: an atomic increment, then the
decision on the count it got), so concurrent attempts cannot slip past the count while earlier
ones are still in flight: the first ``free_attempts`` numbers go through, and after that exactly
one attempt per lockout, the one that wins the turn when a lockout ends (an atomic add of a marker
named after that lockout), which starts the next lockout at once. A refused attempt is taken back;
so is a sign-in or password change that succeeds (its account's count is forgotten, its address's
count goes back to what it was).

The client address is the request's ``REMOTE_ADDR``: behind a reverse proxy, uvicorn's
``--forwarded-allow-ips`` (``FORWARDED_ALLOW_IPS``) makes it the client's. An IPv6 client counts
as its /64 network, since one host commonly holds a whole /64.

The lockout fails closed: with the cache unreachable nothing can be counted, so the attempt is
refused with :class:`Unavailable` (the pages answer 503 with ``Retry-After``) and no password is
checked. Unlike the API's rate limits, which fail open, these forms guard passwords.
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
    """A throttled form: its name in cache keys, the refusal's first sentence when locked out and
    when the cache is unreachable, and its limits."""

    name: str
    refusal: str
    limits: tuple[Limit, ...]
    unavailable: str = "This form is unavailable for a moment."


LOGIN = Action(
    "login",
    "Too many failed sign-in attempts.",
    (Limit("account", 5, 30, 900), Limit("address", 20, 30, 900)),
    "Signing in is unavailable for a moment.",
)
PASSWORD_CHANGE = Action(
    "password_change",
    "Too many wrong current passwords.",
    (Limit("account", 5, 30, 900), Limit("address", 20, 30, 900)),
    "Changing passwords is unavailable for a moment.",
)
PASSWORD_RESET = Action(
    "password_reset",
    "Too many password reset requests.",
    (Limit("email", 3, 60, MEMORY_S), Limit("address", 10, 60, MEMORY_S)),
    "Password reset is unavailable for a moment.",
)
SIGN_UP = Action(
    "sign_up",
    "Too many sign-ups from your network.",
    (Limit("address", 10, 60, MEMORY_S),),
    "Signing up is unavailable for a moment.",
)

#: What an attempt refused because the cache is unreachable is told to wait (seconds).
UNAVAILABLE_RETRY_S = 60


class Refused(Exception):
    """An attempt refused before anything was checked: ``status`` is the HTTP status the page
    answers, ``retry_after_s`` its ``Retry-After`` and ``message`` what the form says."""

    status = 429
    code = "locked_out"

    def __init__(self, action: Action, retry_after_s: int):
        self.action = action
        self.retry_after_s = retry_after_s
        super().__init__(self.message)

    @property
    def message(self) -> str:
        """What the page says."""
        raise NotImplementedError


class LockedOut(Refused):
    """An attempt refused because one of its keys is locked out for ``retry_after_s`` more seconds."""

    @property
    def message(self) -> str:
        """The action's refusal and when to try again."""
        return f"{self.action.refusal} Try again in {_duration(self.retry_after_s)}."


class Unavailable(Refused):
    """An attempt refused because the cache that counts attempts cannot be reached (503)."""

    status = 503
    code = "unavailable"

    def __init__(self, action: Action):
        super().__init__(action, UNAVAILABLE_RETRY_S)

    @property
    def message(self) -> str:
        """Why nothing was checked, and when to try again."""
        return (
            f"{self.action.unavailable} Lab cannot count attempts right now, so it checks none. "
            f"Try again in {_duration(self.retry_after_s)}."
        )


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


#: A lockout as stored: (until, attempts).
Lockout = tuple[float, int]


@dataclass(frozen=True)
class _Keys:
    """The cache keys of one value of one limit; values are hashed so that no email or address
    is stored in the cache."""

    base: str

    @property
    def attempts(self) -> str:
        return f"{self.base}:attempts"

    @property
    def lockout(self) -> str:
        """The current lockout: ``(until, attempts)``, when it ends (seconds since the epoch, by
        ``_now``) and the count of attempts whose lockout it is (its length is ``lockout_s`` of it)."""
        return f"{self.base}:lockout"

    def turn(self, lockout: Lockout) -> str:
        """The marker of the one attempt let through once ``lockout`` is over."""
        return f"{self.base}:turn:{lockout[0]!r}"


def _cache_keys(action: Action, limit: Limit, value: str) -> _Keys:
    return _Keys(f"lockout:{action.name}:{limit.scope}:{sha256_hex(value.strip().lower())[:32]}")


def _keyed_limits(action: Action, values: dict[str, str]) -> list[tuple[Limit, str]]:
    return [(limit, values[limit.scope]) for limit in action.limits if values.get(limit.scope)]


def _increment(key: str) -> int:
    """Add one to the counter ``key`` (created at 0, forgotten ``MEMORY_S`` after its last
    attempt) and return the new count; atomic on Redis."""
    cache.add(key, 0, timeout=MEMORY_S)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add() and incr()
        cache.add(key, 0, timeout=MEMORY_S)
        count = cache.incr(key)
    cache.touch(key, MEMORY_S)
    return count


@dataclass
class _Count:
    """One attempt as counted against one key: the count it got and, when it let this attempt
    through past the free attempts, the lockout it started, the one it replaced and its turn."""

    limit: Limit
    keys: _Keys
    count: int
    lockout: Lockout | None = None
    previous: Lockout | None = None
    turn: str | None = None

    def take_back(self) -> None:
        """Undo this count: the counter goes back down, the lockout it started back to the one
        before (if still its own) and its turn is released."""
        if self.lockout is not None and cache.get(self.keys.lockout) == self.lockout:
            if self.previous is None:
                cache.delete(self.keys.lockout)
            else:
                cache.set(self.keys.lockout, self.previous, timeout=MEMORY_S + self.limit.max_lockout_s)
        if self.turn is not None:
            cache.delete(self.turn)
        try:
            cache.decr(self.keys.attempts)
        except ValueError:  # forgotten meanwhile
            pass

    def forget(self) -> None:
        """Forget every attempt and lockout of this key."""
        keys = [self.keys.attempts, self.keys.lockout]
        if self.previous is not None:
            keys.append(self.keys.turn(self.previous))
        cache.delete_many(keys)


class Attempt:
    """An attempt counted against its action's keys (:func:`begin`); say how it ended with
    :meth:`succeeded`, or leave it counted (a failure)."""

    def __init__(self, counts: list[_Count]):
        self._counts = counts

    def succeeded(self, *, forget: tuple[str, ...] = ("account",)) -> None:
        """Take a successful attempt back: the keys whose scope is in ``forget`` lose every attempt
        and lockout (a right password proves the account's owner), the others this one count.
        With the cache unreachable a warning is logged and the counts stay."""
        try:
            for count in self._counts:
                if count.limit.scope in forget:
                    count.forget()
                else:
                    count.take_back()
        except (RedisError, OSError) as exc:
            logger.warning("lockout: a successful attempt not taken back, the cache is unreachable: %s", exc)

    def _take_back(self) -> None:
        for count in self._counts:
            try:
                count.take_back()
            except (RedisError, OSError, ValueError):
                pass


def _admit(count: _Count, current: Lockout | None, now: float) -> float | None:
    """Decide whether ``count`` (past the free attempts, no lockout in force) goes through, and
    start the lockout it brings. Return None when it goes through, else how long the lockout that
    refuses it lasts (seconds).

    With no lockout yet, the first attempt to create one goes through and starts the first
    lockout; after one, the attempt that wins its turn goes through and starts the next, one
    attempt longer (so attempts refused meanwhile, which were taken back, do not lengthen it)."""
    limit, keys = count.limit, count.keys
    timeout = MEMORY_S + limit.max_lockout_s
    if current is None:
        lockout = (now + limit.lockout_s(limit.free_attempts), limit.free_attempts)
        if cache.add(keys.lockout, lockout, timeout=timeout):
            count.lockout = lockout
            return None
    elif cache.add(keys.turn(current), 1, timeout=MEMORY_S):
        lockout = (now + limit.lockout_s(current[1] + 1), current[1] + 1)
        count.turn, count.previous, count.lockout = keys.turn(current), current, lockout
        cache.set(keys.lockout, lockout, timeout=timeout)
        return None
    # Another attempt took this turn and is starting the next lockout.
    latest = cache.get(keys.lockout)
    return max(1.0, (latest[0] if latest else now) - now)


def begin(action: Action, **values: str) -> Attempt:
    """Count an attempt of ``action`` against each of its keys (``account=``, ``email=``,
    ``address=``), then let it through or refuse it, before anything else is checked.

    Raises LockedOut while a key is locked out, or when another attempt took the one turn a
    lockout's end gives; Unavailable when the cache cannot be reached. A refused attempt is not
    counted. The caller reports a success with ``Attempt.succeeded``; a failure stays counted.
    """
    now = _now()
    counts: list[_Count] = []
    attempt = Attempt(counts)
    try:
        for limit, value in _keyed_limits(action, values):
            keys = _cache_keys(action, limit, value)
            counts.append(_Count(limit, keys, _increment(keys.attempts)))
        # The first free_attempts numbers go through whatever else is in flight: a lockout that
        # an attempt numbered after them started (concurrently) does not refuse them.
        past_free = [count for count in counts if count.count >= count.limit.free_attempts]
        current = cache.get_many([count.keys.lockout for count in past_free])
        wait = max((current[count.keys.lockout][0] - now for count in past_free if count.keys.lockout in current), default=0.0)
        if wait > 0:
            raise LockedOut(action, math.ceil(wait))
        for count in past_free:
            refused_for = _admit(count, current.get(count.keys.lockout), now)
            if refused_for is not None:
                raise LockedOut(action, math.ceil(refused_for))
    except LockedOut:
        attempt._take_back()
        raise
    except (RedisError, OSError) as exc:
        logger.warning("lockout: attempt refused, the cache is unreachable: %s", exc)
        attempt._take_back()
        raise Unavailable(action) from exc
    return attempt


def attempt(action: Action, **values: str) -> None:
    """Count an attempt of an action where every attempt counts (password-reset requests,
    sign-ups). Raises LockedOut or Unavailable, counting nothing, as :func:`begin`."""
    begin(action, **values)


def guarded(form, action: Action, account: str, check):
    """Run ``check`` (a form's password check) as one throttled attempt of ``action`` for
    ``account`` and the form's client address (``form.request``): counted first, refused while
    locked out (``form.locked_out`` keeps the refusal, a ``ValidationError`` carries its message),
    and taken back as a success once ``check`` returns; a wrong password raises from ``check``
    and stays counted. Returns what ``check`` returns."""
    try:
        counted = begin(action, account=account, address=client_address(form.request))
    except Refused as refusal:
        form.locked_out = refusal
        raise ValidationError(refusal.message, code=refusal.code) from None
    result = check()
    counted.succeeded()
    return result


class LockoutAuthenticationMixin:
    """Mix into an AuthenticationForm: count each sign-in per account and client address before
    the password is checked, refusing it while either is locked out (or the cache is unreachable);
    a success forgets the account's failures and takes its own count back from the address.
    ``locked_out`` keeps the refusal for the view (which answers its ``status``)."""

    locked_out: Refused | None = None

    def clean(self):
        email = (self.cleaned_data.get("username") or "").strip().lower()
        if not email:
            return super().clean()
        return guarded(self, LOGIN, email, super().clean)
