-- One measuring round of wrk, read back by bench/httpload.py.
--
--     wrk --latency -s bench/wrk_round.lua http://127.0.0.1:8765/path [-- follow-poll]
--
-- Every endpoint runs through this same script, so the client does the same work for each of them. Each thread
-- counts the statuses it gets; with "follow-poll" it polls as htmx does: a block that comes back (200) replaces
-- the one on the page, and the next polls go to the address in that block's own hx-get (`?v=<rendering id>`),
-- which the server answers with "204 No Content" while nothing changed. done() prints one JSON line, last on
-- stdout, after wrk's own text: the Python side never parses the human summary.

local threads = {}

function setup(thread)
   table.insert(threads, thread)
end

function init(args)
   -- args[0] is the URL, then what follows "--" on the command line
   follow_poll = args[1] == "follow-poll"
   path = wrk.path
   statuses = {}
end

function request()
   return wrk.format(nil, path)
end

function response(status, headers, body)
   statuses[status] = (statuses[status] or 0) + 1
   if follow_poll and status == 200 then
      -- the block's root element carries its own poll address: the first hx-get in the block
      local polled = body:match('hx%-get="([^"]+)"')
      if polled then
         path = polled:gsub("&amp;", "&")
      end
   end
end

local function json_object(entries)
   local parts = {}
   for key, value in pairs(entries) do
      table.insert(parts, string.format('"%s": %d', tostring(key), value))
   end
   return "{" .. table.concat(parts, ", ") .. "}"
end

function done(summary, latency, requests)
   local counted = {}
   for _, thread in ipairs(threads) do
      for status, count in pairs(thread:get("statuses")) do
         counted[status] = (counted[status] or 0) + count
      end
   end
   -- The latency distribution itself (distinct microsecond values and their counts), so that rounds can be
   -- pooled exactly; wrk's own p50/p99 of this round come with it.
   local histogram = {}
   for index = 1, #latency do
      local value, count = latency(index)
      table.insert(histogram, string.format("[%d, %d]", value, count))
   end
   io.write(string.format(
      '{"requests": %d, "duration_us": %d, "bytes": %d, "errors": %s, "statuses": %s, ' ..
      '"p50_us": %d, "p99_us": %d, "latency_us": [%s]}\n',
      summary.requests, summary.duration, summary.bytes, json_object(summary.errors), json_object(counted),
      latency:percentile(50), latency:percentile(99), table.concat(histogram, ", ")
   ))
end
