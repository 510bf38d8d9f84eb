-- wrk straight against the SGLang emulator's `/generate`: short prompts that vary per
-- request, 4-token outputs. Run from bench/wrk (the runner does): `wrk -s emulator_generate.lua`.
dofile("report.lua")

local counter = 0

function init(args)
   math.randomseed(1000 + thread_index)
end

function request()
   counter = counter + 1
   local body = string.format(
      '{"text":"Question %d-%d: what is the capital of country %d?",'
         .. '"sampling_params":{"max_new_tokens":4}}',
      thread_index, counter, math.random(1, 200))
   return wrk.format("POST", "/generate", {["Content-Type"] = "application/json"}, body)
end
