-- wrk straight against the SGLang emulator's `/generate`: short prompts that vary per
-- request, BENCH_OUTPUT_TOKENS-token outputs (default 4). Run from bench/wrk (the runner does):
-- `wrk -s emulator_generate.lua`. With a number after `--` the requests are streamed with that
-- `stream_interval`, as the auction server asks the engine for an answer that its client
-- waits for whole: `wrk -s emulator_generate.lua <url> -- 64`.
dofile("report.lua")

local output_tokens = tonumber(os.getenv("BENCH_OUTPUT_TOKENS") or "4")

local counter = 0
local streamed_params, streamed = "", ""

function init(args)
   math.randomseed(1000 + thread_index)
   if #args > 0 then
      streamed_params = string.format(',"stream_interval":%d', tonumber(args[1]))
      streamed = ',"stream":true'
   end
end

function request()
   counter = counter + 1
   local body = string.format(
      '{"text":"Question %d-%d: what is the capital of country %d?",'
         .. '"sampling_params":{"max_new_tokens":%d%s}%s}',
      thread_index, counter, math.random(1, 200), output_tokens, streamed_params, streamed)
   return wrk.format("POST", "/generate", {["Content-Type"] = "application/json"}, body)
end
