-- POSTs link creations with unique URLs, authenticated with the admin token in TOKEN (admins
-- are not rate limited).
local counter = 0
local threads = 0


function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. os.getenv("TOKEN")
end

function request()
  counter = counter + 1
  local body = string.format('{"long_url":"https://example.com/bench/%d/%d/%d"}', id, counter, math.random(1e9))
  return wrk.format(nil, "/api/v1/links", nil, body)
end
