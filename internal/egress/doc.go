// Package egress owns a sandboxed job's only route to the network: an HTTP
// proxy that aq runs for the job (HTTP CONNECT for TLS and anything else
// tunnelled, and plain HTTP requests in absolute form), offered to the
// engine's process tree through HTTPS_PROXY, HTTP_PROXY and ALL_PROXY
// (docs/sandbox.md, "Network").
//
// What it lets through is Rules: the engine's own API endpoints
// (EngineHosts) and the hosts in AQ_SANDBOX_NET (ParseRules: host,
// *.domain, host:port, an address or range, * for open egress, and named
// sets such as @registries). Whatever the rules, it refuses loopback,
// link-local, private and the other special address ranges unless the
// address or its range is named: the decision is taken on the address a
// name resolves to, and the proxy then dials exactly that address, so a
// name that resolves to a public address when checked and to the metadata
// service when dialled (DNS rebinding) cannot slip through.
//
// Every refusal is counted by host and port and reported (Options.OnRefusal,
// Proxy.Refusals), so that an operator sees what to allow. The proxy is
// bounded: a cap on concurrent connections, a header size limit, timeouts
// for headers, dialling and idle tunnels; Close ends every goroutine it
// started before it returns.
//
// It is a leaf package: the runner starts one Proxy per sandboxed job and
// hands its socket to internal/sandbox.
package egress
