package egress

import (
	"net"
	"net/url"
	"strings"
)

// Env returns base (an engine's environment) pointed at its proxy
// (proxyURL, e.g. "http://127.0.0.1:3128"): both spellings of HTTPS_PROXY,
// HTTP_PROXY and ALL_PROXY, which curl, git, Go, pip, npm, cargo, bundler
// and the engine CLIs honour; NO_PROXY for loopback (the proxy refuses it
// anyway: a test server the engine starts on its own loopback is reached
// directly); NODE_USE_ENV_PROXY=1, without which Node's built-in fetch
// (Node 24 and later) ignores the variables; Yarn 2+'s own variables; and
// the JVM's proxy properties added to JAVA_TOOL_OPTIONS (Maven and Gradle
// ignore the variables). Whatever base says for these keys is replaced
// (JAVA_TOOL_OPTIONS is kept, with the properties after it).
// docs/sandbox.md lists what still does not follow them.
func Env(proxyURL string, base []string) []string {
	set := map[string]string{
		"HTTPS_PROXY": proxyURL, "https_proxy": proxyURL,
		"HTTP_PROXY": proxyURL, "http_proxy": proxyURL,
		"ALL_PROXY": proxyURL, "all_proxy": proxyURL,
		"NO_PROXY": noProxy, "no_proxy": noProxy,
		"NODE_USE_ENV_PROXY": "1",
		"YARN_HTTPS_PROXY":   proxyURL, "YARN_HTTP_PROXY": proxyURL,
	}
	var java string
	if u, err := url.Parse(proxyURL); err == nil {
		if host, port, err := net.SplitHostPort(u.Host); err == nil {
			var opts []string
			for _, scheme := range []string{"http", "https"} {
				opts = append(opts, "-D"+scheme+".proxyHost="+host, "-D"+scheme+".proxyPort="+port)
			}
			java = strings.Join(append(opts, "-Dhttp.nonProxyHosts=localhost|127.0.0.1|[::1]"), " ")
		}
	}
	out := make([]string, 0, len(base)+len(set)+1)
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		if _, replaced := set[k]; replaced {
			continue
		}
		if k == "JAVA_TOOL_OPTIONS" && java != "" {
			java = strings.TrimSpace(v + " " + java)
			continue
		}
		out = append(out, kv)
	}
	for _, k := range envOrder {
		out = append(out, k+"="+set[k])
	}
	if java != "" {
		out = append(out, "JAVA_TOOL_OPTIONS="+java)
	}
	return out
}

var envOrder = []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
	"NO_PROXY", "no_proxy", "NODE_USE_ENV_PROXY", "YARN_HTTPS_PROXY", "YARN_HTTP_PROXY"}

// noProxy is what goes direct: the sandbox's own loopback.
const noProxy = "localhost,127.0.0.1,::1"
