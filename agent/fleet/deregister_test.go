package fleet_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/aqfleet/aq/agent/fleet"
)

// A coordinator without the deregister route (404, as the one in service
// today) is fine: the client remembers it and does not ask again.
func TestDeregisterWithoutTheRoute(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, `{"error":"Cannot POST `+r.URL.Path+`"}`, http.StatusNotFound)
	}))
	defer srv.Close()
	c, err := fleet.NewClient(fleet.ClientOptions{API: srv.URL, Token: "t", FactoryID: "fa"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.Deregister(context.Background()); err != nil {
			t.Fatalf("deregister against a coordinator without the route: %v", err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d calls, want 1 (the 404 is remembered)", n)
	}
}
