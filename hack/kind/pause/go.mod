module github.com/mcpfleet/mcpfleet/hack/kind/pause

go 1.26.0
