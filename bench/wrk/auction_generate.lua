-- wrk against the auction server's `/generate`: the same bodies as emulator_generate.lua plus
-- a bid that varies per request (0.000100 to 0.010000 credits), each request signed with the
-- next of the users' API keys, which the runner passes after `--`.
dofile("report.lua")

local output_tokens = tonumber(os.getenv("BENCH_OUTPUT_TOKENS") or "4")

local counter = 0
local keys = {}

function init(args)
   keys = args
   if #keys == 0 then
      error("pass the users' API keys after --")
   end
   math.randomseed(2000 + thread_index)
   counter = thread_index  -- threads start on different users
end

function request()
   counter = counter + 1
   local key = keys[(counter % #keys) + 1]
   local body = string.format(
      '{"text":"Question %d-%d: what is the capital of country %d?",'
         .. '"bid":"0.%06d","sampling_params":{"max_new_tokens":%d}}',
      thread_index, counter, math.random(1, 200), math.random(100, 10000), output_tokens)
   local headers = {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. key,
   }
   return wrk.format("POST", "/generate", headers, body)
end
