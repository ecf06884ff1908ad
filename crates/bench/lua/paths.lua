-- GETs the paths listed in the file named by the PATHS environment variable, in order,
-- cycling; each wrk thread starts at its own offset. Requests are formatted once, up front,
-- so that the per-request cost on wrk's side is a table lookup.
local requests = {}
local n = 0
local i = 0

function init(args)
  for path in io.lines(os.getenv("PATHS")) do
    n = n + 1
    requests[n] = wrk.format("GET", path)
  end
  i = math.random(n)
end

function request()
  i = i + 1
  if i > n then i = 1 end
  return requests[i]
end
