"""The pilot registry in Redis, shared by every director and ``gridgate pilots`` on that server.

Under the store's prefix: a hash of rows (field ``backend\\x1fendpoint\\x1fjob_id``, value the
pilot's JSON) and one of their states, a set of non-terminal pilots per endpoint, a sorted set
of finished pilots per endpoint and one for all (scored by the time they finished), and a hash
of counters per (backend, endpoint, state), and two of the ``waiting`` pilots and their cores
per (backend, endpoint, group) (built from the rows the first time they are read, for a store
written before they existed). Each bulk write is one Lua script, atomic on the
server; a long list is split into scripts of :data:`CHUNK` pilots so that no one script holds
the server for long. The scripts name their keys from the prefix (one Redis server, not a
cluster), as the store's other keys do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from gridgate.core.pilots import Counts, Pilot, PilotRegistry, Waiting, decode, encode

if TYPE_CHECKING:
    from gridgate.core.state_redis import RedisState

SEP = "\x1f"
#: Pilots per Lua script.
CHUNK = 2000

_PUT = """
local P = KEYS[1]
local rows, states, counts, finall = P..'pilots:row', P..'pilots:state', P..'pilots:count', P..'pilots:finall'
local wn, wc = P..'pilots:waiting', P..'pilots:waiting-cores'
for i = 1, #ARGV, 8 do
  local f, ep, state, terminal, changed, data = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4], ARGV[i+5]
  local grp, cores = ARGV[i+6], tonumber(ARGV[i+7])
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
    redis.call('ZREM', P..'pilots:fin:'..ep, f)
    redis.call('ZREM', finall, f)
  end
  redis.call('HSET', rows, f, data)
  redis.call('HSET', states, f, state)
  redis.call('HINCRBY', counts, ep .. '\\31' .. state, 1)
  if terminal == '1' then
    redis.call('ZADD', P..'pilots:fin:'..ep, changed, f)
    redis.call('ZADD', finall, changed, f)
  else
    redis.call('SADD', P..'pilots:active:'..ep, f)
  end
end
return 1
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
    """The registry of one :class:`~gridgate.core.state_redis.RedisState`, on its client."""

    def __init__(self, store: RedisState) -> None:
        self.store = store
        # answers come decoded to str (the store's client); redis-py's types say bytes | str
        self._client = store.client
        self._p = store.prefix
        self._put = self._client.register_script(_PUT)
        self._prune = self._client.register_script(_PRUNE)
        self._waiting = self._client.register_script(_WAITING)

    def _rows(self, fields: Sequence[str]) -> list[Pilot]:
        if not fields:
            return []
        values = self.store.call(
            "read pilots", self._client.hmget, f"{self._p}pilots:row", list(fields)
        )
        return [decode(cast(str, v)) for v in values if v is not None]

    def put(self, pilots: Iterable[Pilot]) -> None:
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
            ]
        step = 8 * CHUNK
        for start in range(0, len(args), step):
            chunk = args[start : start + step]
            self.store.call("write pilots", self._put, keys=[self._p], args=chunk)

    def active(self, backend: str, endpoint: str) -> list[Pilot]:
        key = f"{self._p}pilots:active:{_ep(backend, endpoint)}"
        fields = cast("set[str]", self.store.call("read pilots", self._client.smembers, key))
        return sorted(self._rows(sorted(fields)), key=lambda p: (p.submitted, p.job_id))

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
            pilots = []
            for _name, value in self.store.call(
                "read pilots",
                lambda: list(self._client.hscan_iter(f"{self._p}pilots:row", count=5000)),
            ):
                pilots.append(decode(value))
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
