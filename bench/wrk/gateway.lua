-- SPDX-License-Identifier: Apache-2.0
-- bench/wrk/gateway.lua — the request generator of bench/gateway.sh.
--
--   wrk ... -s bench/wrk/gateway.lua URL -- MODE PREFIX SEED_KEYS FRESH_PCT [SEED_PREFIX]
--
-- Every request is POST /refunds with the JSON body
--   {"refund_no":"<key>","amount":"1.00"}
-- and the same script drives every target (the bare upstream, the nginx
-- proxy, idem serve), so the client-side cost of building requests and of
-- reading answers is the same for all of them. The body depends on the key
-- only, so a repeated key is a true duplicate (same fingerprint).
--
-- MODE
--   unique  a fresh key per request: PREFIX-<thread>-<counter>
--   scatter as unique, behind 8 random hex digits: <hex>-PREFIX-<thread>-<counter>,
--           so that the keys of a run land all over a key index, as random
--           ids (UUIDs) do, rather than next to each other
--   seed    seed-0 .. seed-(SEED_KEYS-1) in order, round and round, and
--           stops the thread after SEED_KEYS + 64 answers. Run it with -t 1
--           and at most 64 connections: the keys in flight at any moment are
--           then consecutive, never the same key twice. (wrk calls request()
--           once before the run to check the script and throws that request
--           away: on thread 1 the first key is not sent in the first round,
--           so the run goes on into a second round, whose keys are replays.)
--   mix     FRESH_PCT% fresh keys, the rest drawn at random from the seed keys
--   replay  every key drawn at random from the seed keys
--
-- PREFIX makes the fresh keys of one run unlike those of every other run.
-- SEED_PREFIX (default "seed") names the seed keys: SEED_PREFIX-0 and so on;
-- runs that share a store (the distributed one) give each its own.
--
-- At the end, done() prints one line for bench/gateway.sh:
--   GWRESULT requests=N seconds=S rps=R p50_us=A p99_us=B max_us=C
--            replayed=N errors_connect=N errors_read=N errors_write=N
--            errors_timeout=N status_201=N status_409=N ...
-- replayed counts answers carrying "Idempotent-Replayed: true"; status_NNN
-- counts every status code seen (wrk itself counts only >= 400). Before it,
-- one line per thread that saw an answer other than 201:
--   GWSAMPLE <status> <the first 300 bytes of its body>

local threads = {}
local thread_count = 0

function setup(thread)
    thread_count = thread_count + 1
    thread:set("tid", thread_count)
    table.insert(threads, thread)
end

local mode, prefix, nseed, fresh_pct, seed_prefix
local counter = 0
local headers = { ["Content-Type"] = "application/json" }

-- Read back by done() through thread:get(), so these are globals.
statuses = {}
replayed = 0
responses = 0
sample = nil -- the first answer other than 201: "status body"

function init(args)
    mode = args[1] or "unique"
    prefix = args[2] or "run"
    nseed = tonumber(args[3] or "1000")
    fresh_pct = tonumber(args[4] or "10")
    seed_prefix = args[5] or "seed"
    if mode ~= "unique" and mode ~= "scatter" and mode ~= "seed" and mode ~= "mix"
        and mode ~= "replay" then
        error("gateway.lua: unknown mode " .. tostring(mode))
    end
    -- Different threads draw different sequences.
    math.randomseed(os.time() * 1000 + (tid or 0) * 7919)
end

local function body(key)
    return '{"refund_no":"' .. key .. '","amount":"1.00"}'
end

local function fresh()
    return prefix .. "-" .. (tid or 0) .. "-" .. counter
end

local function seeded()
    return seed_prefix .. "-" .. math.random(0, nseed - 1)
end

function request()
    counter = counter + 1
    local key
    if mode == "unique" then
        key = fresh()
    elseif mode == "scatter" then
        key = string.format("%08x-", math.random(0, 0x7fffffff)) .. fresh()
    elseif mode == "seed" then
        key = seed_prefix .. "-" .. ((counter - 1) % nseed)
    elseif mode == "mix" then
        if math.random(100) <= fresh_pct then key = fresh() else key = seeded() end
    else
        key = seeded()
    end
    return wrk.format("POST", "/refunds", headers, body(key))
end

function response(status, hdrs, b)
    responses = responses + 1
    local s = tostring(status)
    statuses[s] = (statuses[s] or 0) + 1
    if status ~= 201 and not sample then
        sample = s .. " " .. string.sub(string.gsub(b or "", "%s+", " "), 1, 300)
    end
    local r = hdrs["Idempotent-Replayed"] or hdrs["idempotent-replayed"]
    if r == "true" then
        replayed = replayed + 1
    end
    if mode == "seed" and responses >= nseed + 64 then
        wrk.thread:stop()
    end
end

function done(summary, latency, _)
    local all = {}
    local rep = 0
    for _, t in ipairs(threads) do
        local st = t:get("statuses") or {}
        for k, v in pairs(st) do all[k] = (all[k] or 0) + v end
        rep = rep + (t:get("replayed") or 0)
        local smp = t:get("sample")
        if smp then io.write("GWSAMPLE " .. smp .. "\n") end
    end
    local secs = summary.duration / 1e6
    local e = summary.errors
    local out = string.format(
        "GWRESULT requests=%d seconds=%.3f rps=%.1f p50_us=%d p99_us=%d max_us=%d replayed=%d "
            .. "errors_connect=%d errors_read=%d errors_write=%d errors_timeout=%d",
        summary.requests, secs, secs > 0 and summary.requests / secs or 0,
        latency:percentile(50.0), latency:percentile(99.0), latency.max, rep,
        e.connect, e.read, e.write, e.timeout)
    local codes = {}
    for k in pairs(all) do table.insert(codes, k) end
    table.sort(codes)
    for _, k in ipairs(codes) do
        out = out .. string.format(" status_%s=%d", k, all[k])
    end
    io.write(out .. "\n")
end
