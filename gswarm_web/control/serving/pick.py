"""The gateway's rule for choosing a replica, written twice: `choose` (pure Python, no I/O) and `PICK`, its atomic
twin in Lua that `live.Share.pick` runs in Redis across every web process. tests/integration/test_gateway_pick_twin.py
asserts that both pick the same replica from the same table.

The rule: the candidates are looked at in turn, starting at `candidates[turn % n]` and wrapping around. A draining
replica is skipped, and so is one that already has `cap` requests in flight (cap 0: no bound). A `round_robin`
service takes the first replica left; any other policy (`least_requests`) the one with the fewest in flight, the
first of them in that order when several tie. The caller keeps the turn (one counter per model, moved on every
pick): the script's is shared by the whole gateway, a process's own picks keep theirs.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence

ROUND_ROBIN = "round_robin"


def choose(
    candidates: Sequence[str],
    in_flight: Mapping[str, int],
    policy: str,
    turn: int,
    draining: Container[str] = frozenset(),
    cap: int = 0,
) -> str | None:
    """The replica to send a request to, or None when every candidate is draining or at `cap`."""
    n = len(candidates)
    best: str | None = None
    fewest: int | None = None
    for i in range(n):
        replica = candidates[(turn + i) % n]
        if replica in draining:
            continue
        count = in_flight.get(replica, 0)
        if (cap == 0 or count < cap) and (fewest is None or count < fewest):
            best, fewest = replica, count
            if policy == ROUND_ROBIN:
                break
    return best


# KEYS: the live counts, the draining set, the replicas' version, this process's share, the turns, the processes.
# ARGV: the model (its turn), the policy, the cap (0: none), this process's id, then the candidates.
# Answers {the replica chosen and counted in flight (false: none), the replicas' version}.
PICK = """
local n = #ARGV - 4
local version = redis.call('get', KEYS[3]) or '0'
if n <= 0 then return {false, version} end
local turn = redis.call('hincrby', KEYS[5], ARGV[1], 1)
local cap = tonumber(ARGV[3])
local best, fewest = false, nil
for i = 0, n - 1 do
  local r = ARGV[5 + ((turn + i) % n)]
  if redis.call('sismember', KEYS[2], r) == 0 then
    local c = tonumber(redis.call('hget', KEYS[1], 'r:' .. r) or '0')
    if (cap == 0 or c < cap) and (fewest == nil or c < fewest) then
      best, fewest = r, c
      if ARGV[2] == 'round_robin' then break end
    end
  end
end
if best then
  redis.call('hincrby', KEYS[1], 'r:' .. best, 1)
  redis.call('hincrby', KEYS[4], 'r:' .. best, 1)
  redis.call('sadd', KEYS[6], ARGV[4])
end
return {best, version}
"""
