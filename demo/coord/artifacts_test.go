package coord

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
)

func upload(content string, epoch int64) map[string]any {
	sum := sha256.Sum256([]byte(content))
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(content))
	zw.Close()
	return map[string]any{"name": "engine-stdout", "kind": "transcript", "contentType": "application/x-ndjson", "encoding": "gzip",
		"size": len(content), "originalSize": len(content), "sha256": hex.EncodeToString(sum[:]), "attempt": 1, "leaseEpoch": epoch,
		"data": base64.StdEncoding.EncodeToString(buf.Bytes())}
}

// TestArtifactsStoreListServe: an upload is checked and stored as a
// pointer plus bytes; the list shows the pointer; the bytes come back
// gzip-encoded with the artifact's content type; a retried upload is not
// stored twice; bad bodies and unknown jobs are refused.
func TestArtifactsStoreListServe(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	r.submit("j1", nil)
	code, m := r.call("POST", "/fleet/jobs/j1/artifacts", tok, upload(`{"type":"result"}`+"\n", 1))
	if code != 201 || m["id"] == "" || m["url"] != "/fleet/artifacts/"+m["id"].(string) || m["factoryId"] != "f1" || m["encoding"] != "gzip" {
		t.Fatalf("upload: %d %v", code, m)
	}
	if code, again := r.call("POST", "/fleet/jobs/j1/artifacts", tok, upload(`{"type":"result"}`+"\n", 1)); code != 200 || again["id"] != m["id"] {
		t.Fatalf("retried upload: %d %v", code, again)
	}
	if n := len(r.s.Artifacts("j1")); n != 1 {
		t.Fatalf("%d artifacts after a retried upload", n)
	}
	code, l := r.call("GET", "/fleet/jobs/j1/artifacts", r.s.EnrollToken(), nil)
	if arts, _ := l["artifacts"].([]any); code != 200 || len(arts) != 1 {
		t.Fatalf("list: %d %v", code, l)
	}
	req, _ := http.NewRequest("GET", r.url+"/fleet/artifacts/"+m["id"].(string), nil)
	req.Header.Set("Authorization", "Bearer "+r.s.EnrollToken())
	req.Header.Set("Accept-Encoding", "gzip") // so the transport hands the gzip bytes over as they are
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("bytes are not gzip: %v", err)
	}
	content, _ := io.ReadAll(zr)
	if resp.Header.Get("Content-Encoding") != "gzip" || resp.Header.Get("Content-Type") != "application/x-ndjson" || string(content) != `{"type":"result"}`+"\n" {
		t.Fatalf("bytes: %v %q", resp.Header, content)
	}

	bad := upload("x", 1)
	bad["size"] = 99
	if code, m := r.call("POST", "/fleet/jobs/j1/artifacts", tok, bad); code != 400 || !strings.Contains(m["error"].(string), "size") {
		t.Fatalf("wrong size: %d %v", code, m)
	}
	bad = upload("x", 1)
	bad["data"] = base64.StdEncoding.EncodeToString([]byte("not gzip"))
	if code, _ := r.call("POST", "/fleet/jobs/j1/artifacts", tok, bad); code != 400 {
		t.Fatalf("not gzip: %d", code)
	}
	if code, _ := r.call("POST", "/fleet/jobs/nope/artifacts", tok, upload("x", 1)); code != 404 {
		t.Fatalf("unknown job: %d", code)
	}
	if code, _ := r.call("GET", "/fleet/artifacts/art-999", tok, nil); code != 404 {
		t.Fatalf("unknown artifact: %d", code)
	}
	if code, _ := r.call("DELETE", "/fleet/artifacts/"+m["id"].(string), tok, nil); code != 200 || len(r.s.Artifacts("j1")) != 0 {
		t.Fatalf("delete: %d", code)
	}

}

// TestWithoutRoutes: a route the stub is told to lack answers 404 as an
// older coordinator would, and is counted; the others still answer.
func TestWithoutRoutes(t *testing.T) {
	r := newRig(t, Options{Without: []string{RouteFactories}})
	if code, _ := r.call("GET", "/fleet/factories", r.s.EnrollToken(), nil); code != 404 {
		t.Fatalf("lacked route: %d", code)
	}
	if code, _ := r.call("GET", "/fleet/jobs", r.s.EnrollToken(), nil); code != 200 {
		t.Fatalf("other route: %d", code)
	}
	if st := r.s.Stats().Routes[RouteFactories]; st.Status["404"] != 1 {
		t.Fatalf("stats %+v", st)
	}
	r.s.SetWithout()
	if code, _ := r.call("GET", "/fleet/factories", r.s.EnrollToken(), nil); code != 200 {
		t.Fatalf("route back: %d", code)
	}
}

// TestActionsRefuseShipped: a shipped job is neither requeued nor rejected
// (409 with the reason); reject records the operator's reason.
func TestActionsRefuseShipped(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	r.submit("j1", nil)
	r.claim("f1", tok)
	if code, m := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "review", "leaseEpoch": 1}); code != 200 {
		t.Fatalf("patch: %d %v", code, m)
	}
	if code, m := r.call("POST", "/fleet/jobs/j1/actions/ship", r.s.EnrollToken(), nil); code != 200 || m["stage"] != "shipped" {
		t.Fatalf("ship: %d %v", code, m)
	}
	for _, a := range []string{"requeue", "reject"} {
		code, m := r.call("POST", "/fleet/jobs/j1/actions/"+a, r.s.EnrollToken(), nil)
		if code != 409 || !strings.Contains(m["error"].(string), "shipped") {
			t.Fatalf("%s of a shipped job: %d %v", a, code, m)
		}
	}
	r.submit("j2", nil)
	if code, m := r.call("POST", "/fleet/jobs/j2/actions/reject", r.s.EnrollToken(), map[string]string{"detail": "not needed"}); code != 200 || m["detail"] != "not needed" || m["stage"] != "failed" {
		t.Fatalf("reject with detail: %d %v", code, m)
	}
}
