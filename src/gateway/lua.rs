//! The two Lua scripts the shared (Redis) rate limiter runs, each atomic on
//! the Redis server and timed by Redis's own clock (`TIME`), so llmlb
//! instances never disagree about time.
//!
//! A bucket is a hash of `level` and `ts`, refilled continuously at
//! capacity / 60 per second up to its capacity, and expiring after two idle
//! minutes (a full bucket needs no storage). Cost: a few hash reads and
//! writes per call.

/// Refills both buckets with Redis's clock, then charges one request and
/// `ARGV[3]` tokens if both allow it. A capacity of 0 means "no limit".
/// Returns `{denied (0 none, 1 requests, 2 tokens), request level, token
/// level, seconds to wait}` (numbers as strings: Redis truncates Lua floats).
pub const TAKE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local l = tonumber(v[1]) or cap
  local ts = tonumber(v[2]) or now
  return math.min(cap, l + math.max(0, now - ts) * cap / 60)
end
local rcap, tcap, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rl, tl = -1, -1
if rcap > 0 then rl = level(KEYS[1], rcap) end
if tcap > 0 then tl = level(KEYS[2], tcap) end
local denied, wait = 0, 0
if rcap > 0 and rl < 1 then
  denied = 1
  wait = (1 - rl) * 60 / rcap
end
if denied == 0 and tcap > 0 then
  local need = math.min(cost, tcap)
  if tl < need then
    denied = 2
    wait = (need - tl) * 60 / tcap
  end
end
if denied == 0 then
  if rcap > 0 then rl = rl - 1 end
  if tcap > 0 then tl = tl - cost end
end
if rcap > 0 then
  redis.call('HSET', KEYS[1], 'level', rl, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
if tcap > 0 then
  redis.call('HSET', KEYS[2], 'level', tl, 'ts', now)
  redis.call('PEXPIRE', KEYS[2], 120000)
end
return {denied, tostring(rl), tostring(tl), tostring(wait)}
"#;

/// Adds `ARGV[2]` (may be negative) to a bucket of capacity `ARGV[1]`.
pub const ADJUST: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cap, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'level', 'ts')
local l = tonumber(v[1]) or cap
local ts = tonumber(v[2]) or now
l = math.min(cap, math.min(cap, l + math.max(0, now - ts) * cap / 60) + delta)
redis.call('HSET', KEYS[1], 'level', l, 'ts', now)
redis.call('PEXPIRE', KEYS[1], 120000)
return tostring(l)
"#;
