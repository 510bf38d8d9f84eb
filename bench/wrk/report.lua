-- Shared by the bench/wrk scripts: counts responses by status in every thread and, when the
-- run ends, prints one machine-readable line, `BENCH_JSON {...}`, with the totals, the status
-- counts and latency percentiles in microseconds (wrk itself reports non-2xx only in total).

local threads = {}

function setup(thread)
   thread:set("thread_index", #threads)
   table.insert(threads, thread)
end

statuses = {}

function response(status, headers, body)
   statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
   local counts = {}
   for _, thread in ipairs(threads) do
      for status, count in pairs(thread:get("statuses")) do
         counts[status] = (counts[status] or 0) + count
      end
   end
   local parts = {}
   for status, count in pairs(counts) do
      table.insert(parts, string.format('"%d":%d', status, count))
   end
   local e = summary.errors
   io.write(string.format(
      'BENCH_JSON {"requests":%d,"duration_us":%d,"statuses":{%s},'
         .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
         .. '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
      summary.requests, summary.duration, table.concat(parts, ","),
      e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean))
end
