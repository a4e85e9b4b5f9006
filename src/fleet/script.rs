//! The one Lua script an instance runs per refresh: register (heartbeat),
//! drop instances whose heartbeat lapsed, and renew this instance's slot
//! lease on each replica, all in one atomic step with the store's clock.
//!
//! Store layout (every key under the fleet's `key_prefix`):
//! - `instances`: sorted set, member = instance id, score = the store time
//!   (ms) its registration lapses;
//! - `info`: hash, instance id → its description (JSON), for the status page;
//! - `epoch`: a random word set by the first instance to find the store
//!   empty: a new word means the store lost its data (restart without
//!   persistence), and every instance treats it as a rejoin;
//! - `lease:{pool}/{replica}`: hash, instance id → `lease:want`;
//! - `queue:{pool}`: hash, instance id → its queue report stamped with the
//!   store's time ([`super::queues`]).
//! - `wake`: a pub/sub channel (no key): an instance that gave slots back
//!   publishes its id there after its refresh ([`super::wake`]).
//!
//! The lease rule, per replica with limit `L`: the instance reports `held`
//! (its in-flight count, or the cap it may still be using, whichever is
//! larger) and `want` (in flight + waiting for that replica). Its new cap is
//! its max-min fair share of `L` among the live instances' wants (the
//! units that do not divide evenly go round the instances in turn, a new
//! turn every 250 ms, so none is starved when `L` is smaller than the
//! number of instances; what no one wants goes, in turn, to the instances
//! with any demand, so a burst finds a slot without a refresh), never
//! more than `L` minus the other instances' leases; its lease is recorded
//! as `max(cap, held)`. So the leases never sum past `L` unless requests
//! already running say so (a store that lost its data), and an instance
//! whose share shrank gives its slots back one refresh later, when its
//! running requests allow. Cost: O(instances) per replica.
//!
//! Then each pool's queue report is written, and the other live
//! instances' reports of that pool are read back.
//!
//! Returns `{epoch, live instances, cap₁, excess₁, cap₂, excess₂, ...,
//! store time (ms), {reports of pool₁}, {reports of pool₂}, ...}`, where
//! `excess` is how far the other instances' leases exceed the even share
//! `⌊L ÷ live⌋` (what a fallback must leave to them).

pub const LEASE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl, prefix = ARGV[1], tonumber(ARGV[2]), ARGV[4]
local epoch = redis.call('GET', KEYS[3])
if not epoch then
  epoch = ARGV[5]
  redis.call('SET', KEYS[3], epoch)
end
redis.call('ZADD', KEYS[1], now + ttl, me)
redis.call('HSET', KEYS[2], me, ARGV[3])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(gone))
end
local live = redis.call('ZCARD', KEYS[1])
local spin = math.floor(now / 250)

local function fair(limit, wants)
  table.sort(wants, function(a, b) return a[1] < b[1] end)
  local n, left, give = #wants, limit, {}
  for k = 1, n do give[k] = 0 end
  while left > 0 do
    local unmet = 0
    for k = 1, n do
      if give[k] < wants[k][2] then unmet = unmet + 1 end
    end
    if unmet == 0 then break end
    local even = math.floor(left / unmet)
    if even == 0 then
      for k = 0, n - 1 do
        local j = ((k + spin) % n) + 1
        if left > 0 and give[j] < wants[j][2] then
          give[j] = give[j] + 1
          left = left - 1
        end
      end
      break
    end
    for k = 1, n do
      local g = math.min(wants[k][2] - give[k], even)
      give[k] = give[k] + g
      left = left - g
    end
  end
  -- What no one asked for goes, in turn, to the instances with any demand:
  -- a burst there finds a slot without waiting for a refresh.
  local asking = 0
  for k = 1, n do
    if wants[k][2] > 0 then asking = asking + 1 end
  end
  if asking > 0 then
    local k = 0
    while left > 0 do
      local j = ((k + spin) % n) + 1
      if wants[j][2] > 0 then
        give[j] = give[j] + 1
        left = left - 1
      end
      k = k + 1
    end
  end
  for k = 1, n do
    if wants[k][1] == me then return give[k] end
  end
  return 0
end

local out = {epoch, live}
local qprefix, n = ARGV[6], tonumber(ARGV[7])
local i = 8
local last = 7 + 4 * n
while i + 3 <= last do
  local key = prefix .. ARGV[i]
  local limit, held, want = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local share = math.max(1, math.floor(limit / live))
  local fields = redis.call('HGETALL', key)
  local others, excess, wants = 0, 0, {}
  for f = 1, #fields, 2 do
    local id = fields[f]
    if id ~= me then
      if redis.call('ZSCORE', KEYS[1], id) then
        local l, w = string.match(fields[f + 1], '^(%d+):(%d+)$')
        l, w = tonumber(l) or 0, tonumber(w) or 0
        others = others + l
        excess = excess + math.max(0, l - share)
        table.insert(wants, {id, w})
      else
        redis.call('HDEL', key, id)
      end
    end
  end
  table.insert(wants, {me, want})
  local cap = math.max(0, math.min(fair(limit, wants), limit - others))
  redis.call('HSET', key, me, math.max(cap, held) .. ':' .. want)
  redis.call('PEXPIRE', key, ttl * 4)
  table.insert(out, cap)
  table.insert(out, excess)
  i = i + 4
end

-- Each pool's queue: this instance's report in, the other live ones' out.
table.insert(out, now)
local j = last + 1
while j + 1 <= #ARGV do
  local key = qprefix .. ARGV[j]
  redis.call('HSET', key, me, now .. ';' .. ARGV[j + 1])
  redis.call('PEXPIRE', key, ttl * 4)
  local fields = redis.call('HGETALL', key)
  local seen = {}
  for f = 1, #fields, 2 do
    local id = fields[f]
    if id ~= me then
      if redis.call('ZSCORE', KEYS[1], id) then
        table.insert(seen, fields[f + 1])
      else
        redis.call('HDEL', key, id)
      end
    end
  end
  table.insert(out, seen)
  j = j + 2
end
return out
"#;
