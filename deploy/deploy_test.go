// Package deploy holds the templates that run aq replicas under a scaler
// (docs/ondemand.md). Docker, Kubernetes and Azure are not on aq's CI
// machines: this test parses every template and checks the relations that
// keep a replica's work safe, and that every AQ_* variable is one aq knows.
package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/job"
)

// node walks a decoded YAML document by keys and indexes.
func node(t *testing.T, doc any, path ...any) any {
	t.Helper()
	cur := doc
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := cur.(map[string]any)
			if !ok {
				t.Fatalf("%v: not a mapping at %q", path, k)
			}
			cur = m[k]
		case int:
			l, ok := cur.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("%v: no item %d", path, k)
			}
			cur = l[k]
		}
	}
	return cur
}

func str(t *testing.T, doc any, path ...any) string {
	t.Helper()
	switch v := node(t, doc, path...).(type) {
	case string:
		return v
	case int:
		return strconv.Itoa(v)
	case nil:
		t.Fatalf("%v is missing", path)
	default:
		t.Fatalf("%v is %T, not a scalar", path, v)
	}
	return ""
}

func seconds(t *testing.T, doc any, path ...any) time.Duration {
	t.Helper()
	n, err := strconv.Atoi(str(t, doc, path...))
	if err != nil {
		t.Fatalf("%v: %v", path, err)
	}
	return time.Duration(n) * time.Second
}

func load(t *testing.T, file string) []any {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var docs []any
	dec := yaml.NewDecoder(f)
	for {
		var d any
		if err := dec.Decode(&d); err != nil {
			if err.Error() == "EOF" {
				return docs
			}
			t.Fatalf("%s: %v", file, err)
		}
		docs = append(docs, d)
	}
}

// env is a container's env list as name → value (valueFrom: "").
func env(t *testing.T, container any) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range node(t, container, "env").([]any) {
		m := e.(map[string]any)
		v, _ := m["value"].(string)
		out[m["name"].(string)] = v
	}
	return out
}

// checkReplica checks what every replica template shares: the command is
// `aq run --once` with a --wait that parses, every AQ_* variable is a
// configuration key, the pool is set, and the drain timeout parses.
func checkReplica(t *testing.T, container any) (vars map[string]string, drain time.Duration) {
	t.Helper()
	var cmd []string
	for _, c := range node(t, container, "command").([]any) {
		cmd = append(cmd, c.(string))
	}
	if len(cmd) < 3 || cmd[0] != "aq" || cmd[1] != "run" || cmd[2] != "--once" {
		t.Fatalf("command %q, want aq run --once …", cmd)
	}
	if i := slices.Index(cmd, "--wait"); i >= 0 {
		if i+1 >= len(cmd) {
			t.Fatal("--wait without a value")
		}
		if _, err := time.ParseDuration(cmd[i+1]); err != nil {
			t.Fatalf("--wait %q: %v", cmd[i+1], err)
		}
	}
	known := map[string]bool{"AZURE_CLIENT_ID": true}
	for _, k := range config.Keys {
		for _, e := range k.Env {
			known[e] = true
		}
	}
	vars = env(t, container)
	for name := range vars {
		if !known[name] {
			t.Errorf("env %s is not an aq configuration variable", name)
		}
	}
	if vars["AQ_FACTORY_POOL"] == "" || vars["AQ_FLEET"] != "1" {
		t.Fatalf("a replica needs AQ_FLEET=1 and AQ_FACTORY_POOL: %v", vars)
	}
	drain, err := time.ParseDuration(vars["AQ_DRAIN_TIMEOUT"])
	if err != nil || drain <= 0 {
		t.Fatalf("AQ_DRAIN_TIMEOUT %q must be set (%v)", vars["AQ_DRAIN_TIMEOUT"], err)
	}
	return vars, drain
}

// A job must be able to run its whole wall budget, then drain, before the
// platform's deadline ends it.
const startup = 5 * time.Minute

func TestKEDAScaledJob(t *testing.T) {
	docs := load(t, filepath.Join("keda", "scaledjob.yaml"))
	var sj, auth any
	for _, d := range docs {
		switch str(t, d, "kind") {
		case "ScaledJob":
			sj = d
		case "TriggerAuthentication":
			auth = d
		}
	}
	if sj == nil || auth == nil {
		t.Fatal("want a ScaledJob and a TriggerAuthentication")
	}
	spec := node(t, sj, "spec")
	for _, c := range []struct {
		path []any
		want string
	}{
		{[]any{"scalingStrategy", "strategy"}, "accurate"},
		{[]any{"rollout", "strategy"}, "gradual"},
		{[]any{"jobTargetRef", "backoffLimit"}, "0"},
		{[]any{"jobTargetRef", "template", "spec", "restartPolicy"}, "Never"},
		{[]any{"triggers", 0, "type"}, "azure-servicebus"},
		{[]any{"triggers", 0, "metadata", "messageCount"}, "1"},
	} {
		if got := str(t, spec, c.path...); got != c.want {
			t.Errorf("spec.%v = %q, want %q", c.path, got, c.want)
		}
	}
	if got := str(t, auth, "spec", "podIdentity", "provider"); got != "azure-workload" {
		t.Errorf("trigger authentication %q, want workload identity", got)
	}
	if str(t, spec, "triggers", 0, "authenticationRef", "name") != str(t, auth, "metadata", "name") {
		t.Error("the trigger does not use the TriggerAuthentication")
	}
	pod := node(t, spec, "jobTargetRef", "template")
	if str(t, pod, "metadata", "labels", "azure.workload.identity/use") != "true" {
		t.Error("the pod does not use workload identity")
	}
	vars, drain := checkReplica(t, node(t, pod, "spec", "containers", 0))
	if got, want := str(t, spec, "triggers", 0, "metadata", "subscriptionName"), vars["AQ_FACTORY_POOL"]; got != want {
		t.Errorf("the trigger watches subscription %q, the replicas receive from the pool's %q", got, want)
	}
	if got, want := str(t, spec, "triggers", 0, "metadata", "topicName"), vars["AQ_SB_TOPIC"]; got != want {
		t.Errorf("trigger topic %q, replicas' AQ_SB_TOPIC %q", got, want)
	}
	if grace := seconds(t, pod, "spec", "terminationGracePeriodSeconds"); grace <= drain {
		t.Errorf("terminationGracePeriodSeconds %s must exceed AQ_DRAIN_TIMEOUT %s", grace, drain)
	}
	if deadline := seconds(t, spec, "jobTargetRef", "activeDeadlineSeconds"); deadline <= job.DefaultWall+drain+startup {
		t.Errorf("activeDeadlineSeconds %s must exceed the wall budget %s + drain %s + start-up %s", deadline, job.DefaultWall, drain, startup)
	}
}

func TestContainerAppsJob(t *testing.T) {
	docs := load(t, filepath.Join("containerapps", "job.yaml"))
	if len(docs) != 1 {
		t.Fatalf("%d documents, want 1", len(docs))
	}
	cfg := node(t, docs[0], "properties", "configuration")
	for _, c := range []struct {
		path []any
		want string
	}{
		{[]any{"triggerType"}, "Event"},
		{[]any{"replicaRetryLimit"}, "0"},
		{[]any{"eventTriggerConfig", "scale", "minExecutions"}, "0"},
		{[]any{"eventTriggerConfig", "scale", "rules", 0, "type"}, "azure-servicebus"},
		{[]any{"eventTriggerConfig", "scale", "rules", 0, "metadata", "messageCount"}, "1"},
	} {
		if got := str(t, cfg, c.path...); got != c.want {
			t.Errorf("configuration.%v = %q, want %q", c.path, got, c.want)
		}
	}
	vars, drain := checkReplica(t, node(t, docs[0], "properties", "template", "containers", 0))
	if got, want := str(t, cfg, "eventTriggerConfig", "scale", "rules", 0, "metadata", "subscriptionName"), vars["AQ_FACTORY_POOL"]; got != want {
		t.Errorf("the rule watches subscription %q, the replicas receive from the pool's %q", got, want)
	}
	if timeout := seconds(t, cfg, "replicaTimeout"); timeout <= job.DefaultWall+drain+startup {
		t.Errorf("replicaTimeout %s must exceed the wall budget %s + drain %s + start-up %s", timeout, job.DefaultWall, drain, startup)
	}
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	stages := regexp.MustCompile(`(?m)^FROM `).FindAllStringIndex(text, -1)
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(stages))
	}
	build, final := text[:stages[len(stages)-1][0]], text[stages[len(stages)-1][0]:]
	for _, want := range []string{"CGO_ENABLED=0", "./cmd/aq", "internal/version.Version="} {
		if !strings.Contains(build, want) {
			t.Errorf("the build stage lacks %q (a static aq, stamped)", want)
		}
	}
	for _, want := range []string{"ca-certificates", " git ", " gh ", "COPY --from=build /out/aq", `ENTRYPOINT ["aq"]`, "USER aq", `CMD ["run", "--once"]`} {
		if !strings.Contains(final, want) {
			t.Errorf("the runtime stage lacks %q", want)
		}
	}
	for _, secret := range []string{"AQ_FLEET_TOKEN", "AQ_SB_CONNECTION_STRING", "ANTHROPIC_API_KEY"} {
		if strings.Contains(text, secret+"=") {
			t.Errorf("the image sets %s: secrets never go into an image", secret)
		}
	}
}
