-- wrk against LiteLLM's proxy `/v1/chat/completions`, signed with its master key (the first
-- argument after `--`), model name the second; answers of BENCH_OUTPUT_TOKENS tokens (default
-- 4) as on the other paths.
dofile("report.lua")

local output_tokens = tonumber(os.getenv("BENCH_OUTPUT_TOKENS") or "4")

local counter = 0
local key, model

function init(args)
   key, model = args[1], args[2]
   if key == nil or model == nil then
      error("pass the master key and the model name after --")
   end
   math.randomseed(3000 + thread_index)
end

function request()
   counter = counter + 1
   local body = string.format(
      '{"model":"%s","max_tokens":%d,"messages":[{"role":"user",'
         .. '"content":"Question %d-%d: what is the capital of country %d?"}]}',
      model, output_tokens, thread_index, counter, math.random(1, 200))
   local headers = {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. key,
   }
   return wrk.format("POST", "/v1/chat/completions", headers, body)
end
