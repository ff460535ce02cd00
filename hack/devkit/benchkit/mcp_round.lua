-- wrk script for `make bench`: MCP requests as a real client sends them.
--
-- MCPFLEET_WRK_MODE (environment) picks what every request is:
--   modern  a 2026-07-28 stateless round: the asking round of the example
--           app's confirm_purchase (the replica seals request_state and
--           answers InputRequiredResult). No session: any replica serves it.
--           Headers as mcp's client stamps them (mcp/client/session.py):
--           MCP-Protocol-Version, Mcp-Method, Mcp-Name equal to the body's.
--   sticky  a handshake-era `ping` on an open session: Mcp-Session-Id taken
--           in turn from the file MCPFLEET_WRK_SESSIONS (one id per line).
-- MCPFLEET_WRK_LIMIT: stop each thread after this many responses (0: none).
--
-- Every response is checked (status 200, and the answer the mode expects);
-- done() prints one line, "mcpfleet-wrk {json}", with the counts and the
-- latency histogram (microseconds -> responses), which benchkit.loadgen reads.

local mode = os.getenv("MCPFLEET_WRK_MODE") or "modern"
local limit = tonumber(os.getenv("MCPFLEET_WRK_LIMIT") or "0")

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"

local expect
if mode == "modern" then
  wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
  wrk.headers["Mcp-Method"] = "tools/call"
  wrk.headers["Mcp-Name"] = "confirm_purchase"
  wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{'
    .. '"name":"confirm_purchase","arguments":{"item":"tea","amount_eur":2},'
    .. '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    .. '"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}},'
    .. '"io.modelcontextprotocol/clientInfo":{"name":"mcpfleet-bench","version":"1"}}}}'
  expect = '"inputRequests"'
elseif mode == "sticky" then
  wrk.headers["MCP-Protocol-Version"] = "2025-11-25"
  wrk.body = '{"jsonrpc":"2.0","id":1,"method":"ping"}'
  expect = '"result"'
  local sessions = {}
  for line in io.lines(os.getenv("MCPFLEET_WRK_SESSIONS")) do
    if #line > 0 then sessions[#sessions + 1] = line end
  end
  local next_session = 0
  function request()
    next_session = next_session % #sessions + 1
    wrk.headers["Mcp-Session-Id"] = sessions[next_session]
    return wrk.format()
  end
else
  error("MCPFLEET_WRK_MODE must be modern or sticky, not " .. mode)
end

local threads = {}
function setup(thread)
  threads[#threads + 1] = thread
end

-- Per thread (each has its own Lua state): responses seen, and the bad ones.
seen = 0
bad = 0
function response(status, headers, body)
  seen = seen + 1
  if status ~= 200 or not string.find(body, expect, 1, true) then
    bad = bad + 1
  end
  if limit > 0 and seen >= limit then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local total_bad, total_seen = 0, 0
  for _, thread in ipairs(threads) do
    total_bad = total_bad + thread:get("bad")
    total_seen = total_seen + thread:get("seen")
  end
  local e = summary.errors
  local hist = {}
  -- latency(i): the i-th distinct latency (microseconds) and its count.
  for i = 1, #latency do
    local us, n = latency(i)
    hist[#hist + 1] = string.format("[%d,%d]", us, n)
  end
  io.write(string.format(
    'mcpfleet-wrk {"requests":%d,"duration_us":%d,"seen":%d,"bad":%d,'
      .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
      .. '"histogram":[%s]}\n',
    summary.requests, summary.duration, total_seen, total_bad,
    e.connect, e.read, e.write, e.status, e.timeout, table.concat(hist, ",")))
end
