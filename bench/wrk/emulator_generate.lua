-- wrk straight against the SGLang emulator's `/generate`: short prompts that vary per
-- request, BENCH_OUTPUT_TOKENS-token outputs (default 4). Run from bench/wrk (the runner does):
-- `wrk -s emulator_generate.lua`.
dofile("report.lua")

local output_tokens = tonumber(os.getenv("BENCH_OUTPUT_TOKENS") or "4")

local counter = 0

function init(args)
   math.randomseed(1000 + thread_index)
end

function request()
   counter = counter + 1
   local body = string.format(
      '{"text":"Question %d-%d: what is the capital of country %d?",'
         .. '"sampling_params":{"max_new_tokens":%d}}',
      thread_index, counter, math.random(1, 200), output_tokens)
   return wrk.format("POST", "/generate", {["Content-Type"] = "application/json"}, body)
end
