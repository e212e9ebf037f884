"""The ``redis`` state driver: several directors on several hosts share one view through Redis.

Each key is a Redis string holding ``"<expires> <value>"`` (``-`` for no expiry), where
``expires`` is an absolute time on the injected clock, so expiry follows that clock exactly as
the other drivers do; a real ``PX`` TTL computed from the same clock lets Redis drop the key
itself. A sorted set (all scores 0) indexes the keys so ``items(prefix)`` is a lexicographic
range, not a ``SCAN`` of the whole server. Records live in one sorted set per stream, scored by
their ``time``, each member the record's JSON text itself: appending a record that is there
already (an append retried after a stall whose first try landed) leaves one row, and records of
one time come back in the order of their text. (A store written before held members
``"<20-digit sequence> <json>"``; those are read as they were.) Every multi-step change is a Lua
script, so it is atomic on the server.

The pilot registry (:class:`RedisPilots`), shared by every director and ``gridgate pilots`` on
that server, lives under the same prefix: a hash of rows (field ``backend\\x1fendpoint\\x1fjob_id``,
value the pilot's JSON) and one of their states, a set of non-terminal pilots per endpoint, a
sorted set of finished pilots per endpoint and one for all (scored by the time they finished), a
hash of counters per (backend, endpoint, state), and two of the ``waiting`` pilots and their
cores per (backend, endpoint, group) (built from the rows the first time they are read, for a
store written before they existed). Each bulk write is one Lua script; a long list is split into
scripts of :data:`CHUNK` pilots so that no one script holds the server for long. The scripts name
their keys from the prefix (one Redis server, not a cluster), as the store's other keys do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, ParamSpec, TypeVar, cast

from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.cutoff import cut_after
from gridgate.core.model import TERMINAL_STATES
from gridgate.core.plugins import ConfigProblems
from gridgate.core.secrets import SECRET_SCHEMA, SecretError, read_secret
from gridgate.core.settings import Settings, settings_from
from gridgate.core.state import (
    Counts,
    LiveStates,
    Pilot,
    PilotRegistry,
    RoomClaim,
    StateError,
    StateStore,
    Waiting,
    check_key,
    check_value,
    encode,
    encode_record,
    expires_at,
)
from gridgate.core.stores.records import pilot_from_json, readable, stream_record
from gridgate.core.text import safe_url, url_secret

#: where an unreadable pilot was read, for the log
_WHERE = "pilot registry (redis)"

try:
    import redis
    from redis.exceptions import RedisError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the 'redis' state driver needs redis-py: pip install 'gridgate[redis]'"
    ) from exc

T = TypeVar("T")
P = ParamSpec("P")

# KEYS: data key, index. ARGV: payload, px ('' for none), now, member.
# A present key whose clock expiry has passed counts as absent; otherwise SET NX PX decides.
_ADD = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local sp = string.find(cur, ' ', 1, true)
  local e = sp and string.sub(cur, 1, sp - 1) or '-'
  if e == '-' or tonumber(e) > tonumber(ARGV[3]) then
    return 0
  end
  redis.call('DEL', KEYS[1])
end
local ok
if ARGV[2] ~= '' then
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
else
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX')
end
if not ok then
  return 0
end
redis.call('ZADD', KEYS[2], 0, ARGV[4])
return 1
"""

# KEYS: data key, index. ARGV: payload, px ('' for none), member.
_SET = """
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('ZADD', KEYS[2], 0, ARGV[3])
return 1
"""

# KEYS: data key, index. ARGV: member. Returns the removed payload (or false).
_DELETE = """
local cur = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return cur
"""

# KEYS: data key, index. ARGV: value, now, member, then a payload and px ('' for none) to
# renew, or nothing to release. Only a live key holding ARGV[1] is renewed (given the payload,
# its new expiry) or released (deleted); 1 if it was, else 0.
_IF_HELD = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  return 0
end
local sp = string.find(cur, ' ', 1, true)
local e = sp and string.sub(cur, 1, sp - 1) or '-'
if e ~= '-' and tonumber(e) <= tonumber(ARGV[2]) then
  return 0
end
if (sp and string.sub(cur, sp + 1) or '') ~= ARGV[1] then
  return 0
end
if #ARGV == 3 then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[3])
  return 1
end
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
else
  redis.call('SET', KEYS[1], ARGV[4])
end
return 1
"""

# KEYS: index, then data keys. ARGV: their members. Drops index entries whose key is gone.
_FORGET = """
local n = 0
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    n = n + redis.call('ZREM', KEYS[1], ARGV[i - 1])
  end
end
return n
"""

# KEYS: data key, index. ARGV: by, now, member. Adds ``by`` to the count held (absent or past
# its clock expiry: 0) and keeps the sum with no expiry; false when the value is not a count.
_INCREMENT = """
local cur = redis.call('GET', KEYS[1])
local count = 0
if cur then
  local sp = string.find(cur, ' ', 1, true)
  local e = sp and string.sub(cur, 1, sp - 1) or '-'
  if e == '-' or tonumber(e) > tonumber(ARGV[2]) then
    local v = sp and string.sub(cur, sp + 1) or ''
    if not string.match(v, '^%-?%d+$') then
      return false
    end
    count = tonumber(v)
  end
end
count = count + tonumber(ARGV[1])
redis.call('SET', KEYS[1], '- ' .. string.format('%d', count))
redis.call('ZADD', KEYS[2], 0, ARGV[3])
return count
"""


def _record_text(member: str) -> str:
    """The JSON text of a stream's member: the member itself, or after the sequence number a
    store written before idempotent appends put in front of it."""
    if member[:1].isdigit():
        return member.partition(" ")[2]
    return member


def _payload(value: str, expires: float | None) -> str:
    return f"{'-' if expires is None else repr(expires)} {value}"


def _decode(payload: str) -> tuple[float | None, str]:
    head, _, value = payload.partition(" ")
    return (None if head == "-" else float(head)), value


REDIS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Shared state in Redis, for several directors.",
    "properties": {
        "url": {
            "type": "string",
            "default": "redis://localhost:6379/0",
            "description": "redis:// or rediss:// URL (unix:// for a socket). Put a "
            "password in the URL only through the environment or a file.",
        },
        "password": {
            **SECRET_SCHEMA,
            "description": "The Redis password (AUTH), from {env: VAR} or {file: PATH}; "
            "never inline, and never in the url.",
        },
        "prefix": {
            "type": "string",
            "default": "gridgate:",
            "description": "Prepended to every Redis key, so several sites can share a server.",
        },
        "socket_timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 5,
            "description": "Seconds to wait for a reply before the call fails.",
        },
        "socket_connect_timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 5,
            "description": "Seconds to wait for a connection.",
        },
        "prune_interval": {
            "maximum": 86400,
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 300,
            "description": "Seconds (clock time) between sweeps of stale key-index entries.",
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class RedisSettings(Settings):
    """The ``state:`` section of the redis driver, typed."""

    section_schema: ClassVar[Mapping[str, Any]] = REDIS_SCHEMA

    url: str
    password: Mapping[str, str] | None
    prefix: str
    socket_timeout: float
    socket_connect_timeout: float
    prune_interval: float


class RedisState(StateStore):
    """State in a Redis server, shared by every director pointed at it."""

    config_schema: ClassVar[dict[str, Any]] = REDIS_SCHEMA

    def __init__(
        self, config: Mapping[str, Any] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        super().__init__(config, clock)
        #: the section, typed (defaults from the schema; a store made in code may name less)
        self.settings = settings = settings_from(
            REDIS_SCHEMA, self.config, RedisSettings, validate=False
        )
        self.url = settings.url
        self.prefix = settings.prefix
        self.prune_interval = settings.prune_interval
        self._index = f"{self.prefix}keys"
        self._last_prune = clock.time()
        extra: dict[str, Any] = {}
        try:
            password = read_secret(settings.password)
        except SecretError as exc:
            raise StateError(f"redis state: cannot read the password: {exc}") from exc
        if password is not None:
            extra["password"] = password
        try:
            self._client = redis.Redis.from_url(
                self.url,
                **extra,
                socket_timeout=settings.socket_timeout,
                socket_connect_timeout=settings.socket_connect_timeout,
                decode_responses=True,
                health_check_interval=30,
            )
        except (ValueError, RedisError) as exc:
            raise StateError(f"redis state: bad url {self._safe_url()}: {exc}") from exc
        #: the longest one call may take: a connection and two replies
        self._call_budget = settings.socket_connect_timeout + 2 * settings.socket_timeout
        self._add = self._client.register_script(_ADD)
        self._set = self._client.register_script(_SET)
        self._delete = self._client.register_script(_DELETE)
        self._forget = self._client.register_script(_FORGET)
        self._increment = self._client.register_script(_INCREMENT)
        self._if_held = self._client.register_script(_IF_HELD)

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        """A password written into the url would sit in the config file and in messages."""
        url = settings_from(REDIS_SCHEMA, section, RedisSettings, validate=False).url
        secret = url_secret(url)  # user:password@ or ?password=
        if secret:
            return [
                (
                    ("url",),
                    f"do not write the password into the url (it carries {secret}); give it "
                    "as password: {env: VARIABLE} or password: {file: PATH}",
                )
            ]
        return []

    def _safe_url(self) -> str:
        # Never log a password that may sit in the URL (user info or ?password=).
        return safe_url(self.url)

    @property
    def client(self) -> redis.Redis:
        """The redis-py client of this store. It decodes every answer to ``str``
        (``decode_responses``), which redis-py's types cannot know: callers cast."""
        return self._client

    def call(self, what: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, a Redis error raised as :class:`StateError` saying that
        this store cannot ``what`` (and never the password)."""
        # socket_timeout bounds each read: a server that answers a byte at a time would hold
        # the director; the whole call gets a connection and two replies' worth, then every
        # connection of the pool is cut (cutoff.cut_after)
        try:
            with cut_after(self._call_budget, self._cut) as cut:
                try:
                    return fn(*args, **kwargs)
                except (RedisError, OSError, ValueError) as exc:
                    # a cut pool may also surface as "I/O operation on closed file"
                    if cut.fired:
                        raise StateError(
                            f"redis state at {self._safe_url()}: cannot {what}: no complete "
                            f"answer within {self._call_budget:g} s: cut"
                        ) from exc
                    raise
        except (RedisError, OSError, ValueError) as exc:
            # OSError: a socket error redis-py let through; ValueError: an answer that is not
            # UTF-8 (decode_responses) or a closed connection's file
            why = str(exc) if isinstance(exc, RedisError) else f"{type(exc).__name__}: {exc}"
            raise StateError(f"redis state at {self._safe_url()}: cannot {what}: {why}") from exc

    def persistence_problem(self) -> str | None:
        """What to say when this server keeps nothing across a restart: neither an append-only
        file (``appendonly no``) nor RDB snapshots (``save ""``). Such a server restarted comes
        back empty, and the director must then search its CEs for its pilots (docs/state.md,
        "A Redis that keeps its data"). None when it keeps its data, and when it cannot be
        asked (CONFIG refused by an ACL or renamed, the server down: nothing is said)."""

        def ask() -> tuple[str, str]:
            appendonly = cast("dict[str, str]", self._client.config_get("appendonly"))
            save = cast("dict[str, str]", self._client.config_get("save"))
            # not config: CONFIG GET's answer, a mapping of the names asked for
            return appendonly.get("appendonly", ""), save.get("save", "")  # not config: above

        try:
            appendonly, save = self.call("read its persistence settings", ask)
        except StateError:
            return None
        if appendonly.strip().lower() != "no" or save.strip():
            return None
        return (
            f"redis state at {self._safe_url()} keeps nothing across a restart: appendonly is "
            f'"no" and save is "" (neither AOF nor RDB). Restarted, it comes back empty and the '
            "director must find its pilots on its CEs again: set appendonly yes (with "
            "appendfsync everysec) or save rules (docs/state.md, 'A Redis that keeps its data')."
        )

    def _cut(self) -> None:
        self._client.connection_pool.disconnect()

    def _key(self, key: str) -> str:
        return f"{self.prefix}kv:{key}"

    def _px(self, expires: float | None) -> str:
        if expires is None:
            return ""
        # Redis' own TTL, from the same clock: at least 1 ms, so SET never sees a zero PX.
        return str(max(1, math.ceil((expires - self.clock.time()) * 1000)))

    def add_if_absent(self, key: str, value: str, ttl: float | None = None) -> bool:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        self._maybe_prune()
        args = [_payload(value, expires), self._px(expires), repr(self.clock.time()), key]
        won = self.call("add", lambda: self._add(keys=[self._key(key), self._index], args=args))
        return bool(won)

    def set(self, key: str, value: str, ttl: float | None = None) -> None:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        self._maybe_prune()
        args = [_payload(value, expires), self._px(expires), key]
        self.call("write", lambda: self._set(keys=[self._key(key), self._index], args=args))

    def increment(self, key: str, by: int = 1) -> int:
        check_key(key)
        keys = [self._key(key), self._index]
        args = [str(int(by)), repr(self.clock.time()), key]
        total = self.call("count", lambda: self._increment(keys=keys, args=args))
        if total is None:
            raise ValueError(f"state key {key!r} holds {self.get(key)!r:.40}, not a count")
        return int(total)

    def _live(self, payload: str | None, now: float) -> tuple[float | None, str] | None:
        if payload is None:
            return None
        expires, value = _decode(payload)
        if expires is not None and expires <= now:
            return None
        return expires, value

    def get(self, key: str) -> str | None:
        payload = cast("str | None", self.call("read", self._client.get, self._key(key)))
        live = self._live(payload, self.clock.time())
        return None if live is None else live[1]

    def delete(self, key: str) -> bool:
        payload = self.call(
            "delete", lambda: self._delete(keys=[self._key(key), self._index], args=[key])
        )
        return self._live(payload or None, self.clock.time()) is not None

    def renew(self, key: str, value: str, ttl: float | None) -> bool:
        check_key(key)
        check_value(value)
        expires = expires_at(self.clock, ttl)
        keys = [self._key(key), self._index]
        args = [value, repr(self.clock.time()), key, _payload(value, expires), self._px(expires)]
        return bool(self.call("renew", lambda: self._if_held(keys=keys, args=args)))

    def delete_if(self, key: str, value: str) -> bool:
        keys = [self._key(key), self._index]
        args = [value, repr(self.clock.time()), key]
        return bool(self.call("release", lambda: self._if_held(keys=keys, args=args)))

    def items(self, prefix: str = "") -> list[tuple[str, str]]:
        low: str
        high: str | bytes
        if prefix:
            # Keys are UTF-8, which never contains byte 0xFF: "[prefix\xff" bounds the range.
            low, high = f"[{prefix}", b"[" + prefix.encode() + b"\xff"
        else:
            low, high = "-", "+"

        def fetch() -> tuple[list[str], list[str | None]]:
            members = cast("list[str]", self._client.zrangebylex(self._index, low, high))
            payloads = self._client.mget([self._key(m) for m in members]) if members else []
            return members, cast("list[str | None]", payloads)

        members, payloads = self.call("list", fetch)
        now = self.clock.time()
        out: list[tuple[str, str]] = []
        gone: list[str] = []
        for member, payload in zip(members, payloads, strict=True):
            if payload is None:
                gone.append(member)
                continue
            live = self._live(payload, now)
            if live is not None:
                out.append((member, live[1]))
        if gone:
            self._forget_members(gone)
        out.sort()
        return out

    def _forget_members(self, members: list[str]) -> None:
        keys = [self._index, *(self._key(m) for m in members)]
        self.call("clean index", lambda: self._forget(keys=keys, args=members))

    def _maybe_prune(self) -> None:
        """Drop index entries whose key Redis has expired, now and then."""
        now = self.clock.time()
        if now - self._last_prune < self.prune_interval:
            return
        self._last_prune = now
        cursor = 0
        while True:
            cursor, batch = self.call(
                "sweep index", self._client.zscan, self._index, cursor, count=500
            )
            members = [cast(str, m) for m, _score in batch]
            if members:
                payloads = self.call(
                    "sweep index", self._client.mget, [self._key(m) for m in members]
                )
                gone = [m for m, p in zip(members, payloads, strict=True) if p is None]
                if gone:
                    self._forget_members(gone)
            if cursor == 0:
                break

    def ttl(self, key: str) -> float | None:
        payload = cast("str | None", self.call("read", self._client.get, self._key(key)))
        now = self.clock.time()
        live = self._live(payload, now)
        if live is None or live[0] is None:
            return None
        return live[0] - now

    def append_record(self, stream: str, record: Mapping[str, Any]) -> None:
        check_key(stream)
        when, text = encode_record(record)
        key = f"{self.prefix}rec:{stream}"
        # NX: a member already there keeps its score; the same text is the same record
        self.call("append", lambda: self._client.zadd(key, {text: when}, nx=True))

    def prune_records(self, stream: str, before: float) -> int:
        key = f"{self.prefix}rec:{stream}"
        return int(
            self.call(
                "prune records",
                lambda: self._client.zremrangebyscore(key, "-inf", f"({float(before)!r}"),
            )
        )

    def records(self, stream: str, since: float = 0.0) -> list[dict[str, Any]]:
        members = self.call(
            "read records",
            lambda: self._client.zrangebyscore(
                f"{self.prefix}rec:{stream}", repr(float(since)), "+inf"
            ),
        )
        texts = (_record_text(m) for m in cast("list[str]", members))
        return readable(texts, stream_record, f"state records {stream}")

    def pilot_registry(self) -> PilotRegistry:
        """The pilot registry on this server, under this store's prefix."""
        registry = self._pilot_registry
        if registry is None:
            registry = self._pilot_registry = RedisPilots(self)
        return registry

    def close(self) -> None:
        try:
            self._client.close()
        except (RedisError, OSError):
            pass  # a connection that is gone is closed


# --- the pilot registry ------------------------------------------------------------------------

SEP = "\x1f"
#: Between the values of one list in the answer of a lean read (``_LIVE``).
RS = "\x1e"
#: Pilots per Lua script.
CHUNK = 2000
#: The arguments of one pilot to _PUT.
_PUT_FIELDS = 9

_PUT = """
local P = KEYS[1]
local rows, states, counts, finall = P..'pilots:row', P..'pilots:state', P..'pilots:count', P..'pilots:finall'
local wn, wc = P..'pilots:waiting', P..'pilots:waiting-cores'
for i = 1, #ARGV, 9 do
  local f, ep, state, terminal, changed, data = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4], ARGV[i+5]
  local grp, cores, submitted = ARGV[i+6], tonumber(ARGV[i+7]), ARGV[i+8]
  local job = string.sub(f, #ep + 2)
  local old = redis.call('HGET', states, f)
  if old == 'waiting' then
    local was = cjson.decode(redis.call('HGET', rows, f))
    local g = ep .. '\\31' .. (was['group'] or 'default')
    redis.call('HINCRBY', wn, g, -1)
    redis.call('HINCRBY', wc, g, -(tonumber(was['cores']) or 1))
  end
  if state == 'waiting' then
    redis.call('HINCRBY', wn, ep .. '\\31' .. grp, 1)
    redis.call('HINCRBY', wc, ep .. '\\31' .. grp, cores)
  end
  if old then
    redis.call('HINCRBY', counts, ep .. '\\31' .. old, -1)
    redis.call('SREM', P..'pilots:active:'..ep, f)
    local was = redis.call('HGET', P..'pilots:live-member:'..ep, job)
    if was then
      redis.call('ZREM', P..'pilots:live:'..ep, was)
    end
    redis.call('ZREM', P..'pilots:fin:'..ep, f)
    redis.call('ZREM', finall, f)
  end
  redis.call('HSET', rows, f, data)
  redis.call('HSET', states, f, state)
  redis.call('HINCRBY', counts, ep .. '\\31' .. state, 1)
  if terminal == '1' then
    redis.call('ZADD', P..'pilots:fin:'..ep, changed, f)
    redis.call('ZADD', finall, changed, f)
    redis.call('HDEL', P..'pilots:live-member:'..ep, job)
  else
    local member = job .. '\\31' .. state .. '\\31' .. submitted
    redis.call('SADD', P..'pilots:active:'..ep, f)
    redis.call('ZADD', P..'pilots:live:'..ep, submitted, member)
    redis.call('HSET', P..'pilots:live-member:'..ep, job, member)
  end
end
return 1
"""

# The lean read of a poll (ARGV: the endpoint): its live pilots as a sorted set beside the
# ``active`` set, kept by _PUT, whose members are ``job id SEP state SEP submitted`` scored by
# submission time (a hash job id -> member says which member to replace), returned as one
# string, the members joined by RS: one value for redis-py to parse, not one a pilot, and no
# score to format. A store written before the sorted sets existed gets each one built from the
# rows on its endpoint's first read (the marker says it is kept since).
_LIVE = """
local P, ep = KEYS[1], ARGV[1]
local live, mark = P..'pilots:live:'..ep, P..'pilots:live-kept:'..ep
local members = P..'pilots:live-member:'..ep
if redis.call('EXISTS', mark) == 0 then
  redis.call('DEL', live, members)
  local skip = #ep + 2
  for _, f in ipairs(redis.call('SMEMBERS', P..'pilots:active:'..ep)) do
    local state = redis.call('HGET', P..'pilots:state', f)
    local ok, row = pcall(cjson.decode, redis.call('HGET', P..'pilots:row', f) or '')
    local at = ok and type(row) == 'table' and tonumber(row['submitted']) or 0
    if state then
      local job = string.sub(f, skip)
      local member = job .. '\\31' .. state .. '\\31' .. string.format('%.17g', at)
      redis.call('ZADD', live, at, member)
      redis.call('HSET', members, job, member)
    end
  end
  redis.call('SET', mark, '1')
end
local all = redis.call('ZRANGE', live, 0, -1)
return {table.concat(all, '\\30'), #all}
"""

# The waiting pilots by (backend, endpoint, group) and their cores. The first read on a store
# written before these counters existed builds them from the rows (one scan, once: the marker
# says they are kept since); until then a write may have moved them, so they are rebuilt whole.
_WAITING = """
local P = KEYS[1]
local wn, wc, mark = P..'pilots:waiting', P..'pilots:waiting-cores', P..'pilots:waiting-kept'
if redis.call('EXISTS', mark) == 0 then
  redis.call('DEL', wn, wc)
  local all = redis.call('HGETALL', P..'pilots:state')
  for i = 1, #all, 2 do
    if all[i+1] == 'waiting' then
      local f = all[i]
      local row = cjson.decode(redis.call('HGET', P..'pilots:row', f))
      local a = string.find(f, '\\31', 1, true)
      local b = string.find(f, '\\31', a + 1, true)
      local g = string.sub(f, 1, b - 1) .. '\\31' .. (row['group'] or 'default')
      redis.call('HINCRBY', wn, g, 1)
      redis.call('HINCRBY', wc, g, tonumber(row['cores']) or 1)
    end
  end
  redis.call('SET', mark, '1')
end
return {redis.call('HGETALL', wn), redis.call('HGETALL', wc)}
"""

# Room for one submission, atomically (PilotRegistry.reserve). ARGV: holder, backend, endpoint,
# count, cores per pilot, max_waiting, max_waiting_cores, max_total ('' for none), expires,
# now, the terminal states (comma-separated). Counts the endpoint's waiting pilots and their
# cores, the backend's non-terminal pilots and the others' live reservations (dropping those
# that lapsed); keeps the reservation of what fits ("backend SEP endpoint SEP n SEP cores SEP
# expires" under the holder) and returns how many.
_RESERVE = """
local P = KEYS[1]
local resv = P..'pilots:resv'
local b, ep = ARGV[2], ARGV[2]..'\\31'..ARGV[3]
local now, per = tonumber(ARGV[10]), math.max(1, tonumber(ARGV[5]))
local terminal = {}
for s in string.gmatch(ARGV[11], '[^,]+') do terminal[s] = true end
local waiting, active = 0, 0
local counts = redis.call('HGETALL', P..'pilots:count')
for i = 1, #counts, 2 do
  local f = counts[i]
  local a = string.find(f, '\\31', 1, true)
  local c = string.find(f, '\\31', a + 1, true)
  if string.sub(f, 1, a - 1) == b then
    local state, n = string.sub(f, c + 1), tonumber(counts[i + 1])
    if not terminal[state] then active = active + n end
    if state == 'waiting' and string.sub(f, 1, c - 1) == ep then waiting = waiting + n end
  end
end
local cores = waiting
if redis.call('EXISTS', P..'pilots:waiting-kept') == 1 then
  cores = 0
  local wc = redis.call('HGETALL', P..'pilots:waiting-cores')
  for i = 1, #wc, 2 do
    if string.sub(wc[i], 1, #ep + 1) == ep..'\\31' then cores = cores + tonumber(wc[i + 1]) end
  end
end
local rn, rc, rb = 0, 0, 0
local held = redis.call('HGETALL', resv)
for i = 1, #held, 2 do
  local h, parts = held[i], {}
  for p in string.gmatch(held[i + 1], '[^\\31]+') do parts[#parts + 1] = p end
  if tonumber(parts[5]) <= now then
    redis.call('HDEL', resv, h)
  elseif h ~= ARGV[1] and parts[1] == b then
    rb = rb + tonumber(parts[3])
    if parts[2] == ARGV[3] then
      rn, rc = rn + tonumber(parts[3]), rc + tonumber(parts[4])
    end
  end
end
local take = tonumber(ARGV[4])
if ARGV[6] ~= '' then take = math.min(take, tonumber(ARGV[6]) - waiting - rn) end
if ARGV[7] ~= '' then take = math.min(take, math.floor((tonumber(ARGV[7]) - cores - rc) / per)) end
if ARGV[8] ~= '' then take = math.min(take, tonumber(ARGV[8]) - active - rb) end
if take < 0 then take = 0 end
if take > 0 then
  local v = b..'\\31'..ARGV[3]..'\\31'..take..'\\31'..(take * per)..'\\31'..ARGV[9]
  redis.call('HSET', resv, ARGV[1], v)
end
return take
"""

# ARGV: before, limit. Forgets up to limit terminal pilots that finished before ``before``.
_PRUNE = """
local P = KEYS[1]
local rows, states, counts, finall = P..'pilots:row', P..'pilots:state', P..'pilots:count', P..'pilots:finall'
local gone = redis.call('ZRANGEBYSCORE', finall, '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, f in ipairs(gone) do
  local a = string.find(f, '\\31', 1, true)
  local b = string.find(f, '\\31', a + 1, true)
  local ep = string.sub(f, 1, b - 1)
  local state = redis.call('HGET', states, f)
  if state then
    redis.call('HINCRBY', counts, ep .. '\\31' .. state, -1)
  end
  redis.call('HDEL', rows, f)
  redis.call('HDEL', states, f)
  redis.call('ZREM', P..'pilots:fin:'..ep, f)
  redis.call('ZREM', finall, f)
end
return #gone
"""


def _ep(backend: str, endpoint: str) -> str:
    return f"{backend}{SEP}{endpoint}"


def _field(pilot: Pilot) -> str:
    return f"{pilot.backend}{SEP}{pilot.endpoint}{SEP}{pilot.job_id}"


class RedisPilots(PilotRegistry):
    """The registry of one :class:`~gridgate.core.stores.redis.RedisState`, on its client."""

    def __init__(self, store: RedisState) -> None:
        self.store = store
        # answers come decoded to str (the store's client); redis-py's types say bytes | str
        self._client = store.client
        self._p = store.prefix
        self._put = self._client.register_script(_PUT)
        self._prune = self._client.register_script(_PRUNE)
        self._waiting = self._client.register_script(_WAITING)
        self._live = self._client.register_script(_LIVE)
        self._reserve = self._client.register_script(_RESERVE)
        self._cores_kept = False

    def _rows(self, fields: Sequence[str]) -> list[Pilot]:
        if not fields:
            return []
        values = self.store.call(
            "read pilots", self._client.hmget, f"{self._p}pilots:row", list(fields)
        )
        return readable((v for v in values if v is not None), pilot_from_json, _WHERE)

    def put(self, pilots: Iterable[Pilot]) -> None:
        args = self._put_args(pilots)
        step = _PUT_FIELDS * CHUNK
        for start in range(0, len(args), step):
            chunk = args[start : start + step]
            self.store.call("write pilots", self._put, keys=[self._p], args=chunk)

    @staticmethod
    def _put_args(pilots: Iterable[Pilot]) -> list[str]:
        args: list[str] = []
        for pilot in pilots:
            args += [
                _field(pilot),
                _ep(pilot.backend, pilot.endpoint),
                pilot.state,
                "1" if pilot.terminal else "0",
                repr(float(pilot.changed)),
                encode(pilot),
                pilot.group,
                str(pilot.cores),
                repr(float(pilot.submitted)),
            ]
        return args

    def active(self, backend: str, endpoint: str) -> list[Pilot]:
        key = f"{self._p}pilots:active:{_ep(backend, endpoint)}"
        fields = cast("set[str]", self.store.call("read pilots", self._client.smembers, key))
        return sorted(self._rows(sorted(fields)), key=lambda p: (p.submitted, p.job_id))

    def live_states(self, backend: str, endpoint: str) -> LiveStates:
        ep = _ep(backend, endpoint)
        text, n = cast(
            "tuple[str, int]",
            self.store.call("read pilot states", lambda: self._live(keys=[self._p], args=[ep])),
        )
        if not n:
            return LiveStates()
        # job SEP state SEP submitted RS job SEP ...: split at C speed, with no loop a pilot
        parts = text.replace(SEP, RS).split(RS)
        if len(parts) != 3 * n:  # a job id holding SEP or RS: read whole rows
            return super().live_states(backend, endpoint)
        ids = parts[::3]
        return LiveStates(
            dict(zip(ids, parts[1::3], strict=True)),
            dict(zip(ids, map(float, parts[2::3]), strict=True)),
        )

    def get_many(self, backend: str, endpoint: str, job_ids: Iterable[str]) -> list[Pilot]:
        prefix = f"{_ep(backend, endpoint)}{SEP}"
        return self._rows([prefix + job for job in dict.fromkeys(job_ids)])

    def counts(self) -> Counts:
        raw = cast(
            "dict[str, str]",
            self.store.call("count pilots", self._client.hgetall, f"{self._p}pilots:count"),
        )
        out: Counts = {}
        for name, value in raw.items():
            number = int(value)
            if number > 0:
                backend, endpoint, state = name.split(SEP)
                out[(backend, endpoint, state)] = number
        return out

    def waiting(self) -> Waiting:
        numbers, cores = cast(
            "list[list[str]]",
            self.store.call("count waiting pilots", lambda: self._waiting(keys=[self._p])),
        )
        by_cores = dict(zip(cores[::2], cores[1::2], strict=True))
        out: Waiting = {}
        for name, value in zip(numbers[::2], numbers[1::2], strict=True):
            if int(value) > 0:
                backend, endpoint, group = name.split(SEP)
                out[(backend, endpoint, group)] = (int(value), int(by_cores.get(name, value)))
        return out

    def last_finished(self, backend: str, endpoint: str, n: int, after: float = 0.0) -> list[Pilot]:
        key = f"{self._p}pilots:fin:{_ep(backend, endpoint)}"
        fields = self.store.call(
            "read pilots",
            lambda: self._client.zrevrangebyscore(
                key, "+inf", f"({float(after)!r}", start=0, num=int(n)
            ),
        )
        return self._rows(cast("list[str]", fields))

    def query(
        self,
        backend: str | None = None,
        endpoint: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Pilot]:
        if backend is not None and endpoint is not None:
            ep = _ep(backend, endpoint)

            def fields() -> list[str]:
                active = cast("set[str]", self._client.smembers(f"{self._p}pilots:active:{ep}"))
                done = cast("list[str]", self._client.zrange(f"{self._p}pilots:fin:{ep}", 0, -1))
                return sorted(active | set(done))

            pilots = self._rows(self.store.call("read pilots", fields))
        else:
            rows = self.store.call(
                "read pilots",
                lambda: list(self._client.hscan_iter(f"{self._p}pilots:row", count=5000)),
            )
            pilots = readable((value for _name, value in rows), pilot_from_json, _WHERE)
        wanted = set(states) if states else None
        rows = [
            p
            for p in pilots
            if (backend is None or p.backend == backend)
            and (endpoint is None or p.endpoint == endpoint)
            and (wanted is None or p.state in wanted)
        ]
        rows.sort(key=lambda p: (p.backend, p.endpoint, p.submitted, p.job_id))
        return rows if limit is None else rows[:limit]

    def get(self, backend: str, endpoint: str, job_id: str) -> Pilot | None:
        field = f"{backend}{SEP}{endpoint}{SEP}{job_id}"
        found = self._rows([field])
        return found[0] if found else None

    def prune(self, before: float) -> int:
        total = 0
        while True:
            gone = int(
                self.store.call(
                    "prune pilots",
                    lambda: self._prune(keys=[self._p], args=[repr(float(before)), str(CHUNK)]),
                )
            )
            total += gone
            if gone < CHUNK:
                return total

    def reserve(self, claim: RoomClaim, now: float) -> int:
        if claim.max_waiting_cores is not None and not self._cores_kept:
            self.waiting()  # a store from before the waiting counters builds them, once
            self._cores_kept = True

        def limit(value: int | None) -> str:
            return "" if value is None else str(int(value))

        args = [
            claim.holder,
            claim.backend,
            claim.endpoint,
            str(int(claim.count)),
            str(int(claim.cores)),
            limit(claim.max_waiting),
            limit(claim.max_waiting_cores),
            limit(claim.max_total),
            repr(float(claim.expires)),
            repr(float(now)),
            ",".join(sorted(TERMINAL_STATES)),
        ]
        taken = self.store.call("reserve room", lambda: self._reserve(keys=[self._p], args=args))
        return int(taken)

    def settle(self, holder: str) -> None:
        self.store.call("settle room", self._client.hdel, f"{self._p}pilots:resv", holder)

    def put_reserved(self, pilots: Iterable[Pilot], holder: str) -> None:
        pilots = list(pilots)
        args = self._put_args(pilots)
        if len(args) > _PUT_FIELDS * CHUNK:  # not one submission's: settled after them
            super().put_reserved(pilots, holder)
            return

        def both() -> Any:
            pipe = self._client.pipeline(transaction=True)  # MULTI ... EXEC: one step
            self._put(keys=[self._p], args=args, client=pipe)
            pipe.hdel(f"{self._p}pilots:resv", holder)
            return pipe.execute()

        self.store.call("write pilots", both)
