-- wrk against LiteLLM's proxy `/v1/chat/completions`, signed with its master key (the first
-- argument after `--`), model name the second; 4-token answers as the other paths.
dofile("report.lua")

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
      '{"model":"%s","max_tokens":4,"messages":[{"role":"user",'
         .. '"content":"Question %d-%d: what is the capital of country %d?"}]}',
      model, thread_index, counter, math.random(1, 200))
   local headers = {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. key,
   }
   return wrk.format("POST", "/v1/chat/completions", headers, body)
end
