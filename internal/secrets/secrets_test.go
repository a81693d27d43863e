package secrets

import (
	"bytes"
	"encoding/base64"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func TestIsSecretName(t *testing.T) {
	for name, want := range map[string]bool{
		"AQ_FLEET_TOKEN":             true,
		"AQ_SB_CONNECTION_STRING":    true,
		"GITHUB_TOKEN":               true,
		"ANTHROPIC_API_KEY":          true,
		"DB_PASSWORD":                true,
		"MY_SECRET":                  true,
		"AQ_NOTIFY_URL":              true,
		"OTEL_EXPORTER_OTLP_HEADERS": true,
		"AQ_HOME":                    false,
		"PATH":                       false,
		"KEYBOARD":                   false,
	} {
		if got := IsSecretName(name); got != want {
			t.Errorf("IsSecretName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestEngineEnvDropsAQSecretsAndMarkers(t *testing.T) {
	env := []string{
		"PATH=/bin", "AQ_FLEET_TOKEN=tok-123456", "AQ_SB_CONNECTION_STRING=Endpoint=sb://x",
		"AQ_ENROLL_TOKEN=enr-0000", "AQ_HOME=/h", "CLAUDECODE=1", "ANTHROPIC_API_KEY=sk-keep",
		"AQ_OTHER_SECRET=zzzzzz", "EXTRA=1",
		"AZURE_CLIENT_ID=app-id", "AZURE_TENANT_ID=tenant", "AZURE_CLIENT_SECRET=azs-secret", "AZURE_FEDERATED_TOKEN_FILE=/var/run/token",
		"AZURE_CLIENT_CERTIFICATE_PATH=/etc/cert.pem", "AZURE_CLIENT_CERTIFICATE_PASSWORD=certpw", "AZURE_PASSWORD=pw123", "IDENTITY_HEADER=hdr", "MSI_SECRET=msi",
		"AQ_NOTIFY_URL=https://hooks.example/T0/B0/xyz", "OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer otlp-tok",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS=x-api-key=k", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318",
	}
	got := strings.Join(EngineEnv(env, "EXTRA"), " ")
	for _, gone := range []string{"AQ_FLEET_TOKEN", "AQ_SB_CONNECTION_STRING", "AQ_ENROLL_TOKEN", "CLAUDECODE", "AQ_OTHER_SECRET", "EXTRA",
		"AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_CLIENT_CERTIFICATE_PASSWORD", "AZURE_PASSWORD", "IDENTITY_HEADER", "MSI_SECRET",
		"AQ_NOTIFY_URL", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		if strings.Contains(got, gone+"=") {
			t.Errorf("EngineEnv kept %s: %s", gone, got)
		}
	}
	for _, kept := range []string{"PATH=/bin", "AQ_HOME=/h", "ANTHROPIC_API_KEY=sk-keep", "AZURE_CLIENT_ID=app-id", "AZURE_TENANT_ID=tenant", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318"} {
		if !strings.Contains(got, kept) {
			t.Errorf("EngineEnv dropped %s: %s", kept, got)
		}
	}
}

func TestRedactor(t *testing.T) {
	r := NewRedactor([]string{"GITHUB_TOKEN=ghp_abcdef", "PATH=/usr/bin", "SHORT_KEY=ab"}, "s3cr3t-value")
	in := "token ghp_abcdef and s3cr3t-value but /usr/bin and ab stay"
	want := "token *** and *** but /usr/bin and ab stay"
	if got := r.String(in); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	var nilR *Redactor
	if nilR.String("x") != "x" {
		t.Fatal("nil redactor must pass text through")
	}
}

func TestWriterMasksSecretSplitAcrossWrites(t *testing.T) {
	var out bytes.Buffer
	r := NewRedactor(nil, "supersecret")
	w := NewWriter(&out, r)
	for _, chunk := range []string{"line one super", "secret here\nsecond ", "line supersecret"} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := "line one *** here\nsecond line ***"
	if out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
}

func TestWriterFlushesLongLinesWithoutLeaking(t *testing.T) {
	var out bytes.Buffer
	r := NewRedactor(nil, "topsecret")
	w := NewWriter(&out, r)
	long := strings.Repeat("x", maxLineBuffer+10)
	w.Write([]byte(long + "tops"))
	w.Write([]byte("ecret\n"))
	w.Close()
	if strings.Contains(out.String(), "topsecret") {
		t.Fatal("secret leaked across a long-line flush")
	}
	if !strings.HasSuffix(out.String(), "***\n") {
		t.Fatalf("unexpected tail %q", out.String()[len(out.String())-20:])
	}
}

// TestRedactorMasksEncodings (issue #26, finding 4): base64 of a secret —
// alone, inside the base64 of a longer text at each alignment, in the URL
// alphabet — and its URL-encoding are masked in anything written through
// the Redactor, so a job cannot get a token past the mask by encoding it.
func TestRedactorMasksEncodings(t *testing.T) {
	tok := "aqf_Tok+en/with=odd&chars?_0123456789"
	r := NewRedactor(nil, tok)
	for _, c := range []struct{ name, text string }{
		{"base64", base64.StdEncoding.EncodeToString([]byte(tok))},
		{"base64 with a newline after", base64.StdEncoding.EncodeToString([]byte(tok + "\n"))},
		{"inside base64, offset 1", base64.StdEncoding.EncodeToString([]byte("x" + tok + "tail"))},
		{"inside base64, offset 2", base64.StdEncoding.EncodeToString([]byte("xy" + tok + "tail"))},
		{"inside base64, offset 3", base64.StdEncoding.EncodeToString([]byte("xyz" + tok))},
		{"base64url", base64.URLEncoding.EncodeToString([]byte("ab" + tok))},
		{"raw base64url", base64.RawURLEncoding.EncodeToString([]byte(tok))},
		{"query-escaped", "https://x.example/?t=" + url.QueryEscape(tok)},
		{"path-escaped", "https://x.example/" + url.PathEscape(tok) + "/y"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := r.String("out: " + c.text + " end")
			if !strings.Contains(got, Mask) {
				t.Fatalf("nothing masked in %q", got)
			}
			// What is left of the encoding carries at most a few bits of
			// the token at each end: none of its encoded forms.
			for _, e := range append([]string{tok}, Encodings(tok)...) {
				if strings.Contains(got, e) {
					t.Fatalf("%q still holds %q", got, e)
				}
			}
		})
	}
	// Ordinary text is untouched, and short secrets add no encodings that
	// would mask it.
	if got := r.String("plain words and base64 aGVsbG8gd29ybGQ= stay"); got != "plain words and base64 aGVsbG8gd29ybGQ= stay" {
		t.Fatalf("masked %q", got)
	}
	if e := Encodings("abcd"); len(e) != 0 {
		t.Fatalf("a 4-byte secret got encodings %q", e)
	}
}

func TestRedactorValues(t *testing.T) {
	r := NewRedactor([]string{"GH_TOKEN=ghp_0123456789abcdefghij", "HOME=/home/x"}, "  factory-token-0123456789  ", "ab")
	r.Add("factory-token-0123456789")
	got := r.Values()
	want := []string{"ghp_0123456789abcdefghij", "factory-token-0123456789"}
	if !slices.Equal(got, want) {
		t.Fatalf("Values = %q, want %q (each once, trimmed, without encodings or short values)", got, want)
	}
	if (*Redactor)(nil).Values() != nil {
		t.Fatal("a nil Redactor has values")
	}
}
