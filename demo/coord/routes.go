package coord

import (
	"fmt"
	"html"
	"net/http"
	"slices"
)

// Route sets (Options.Routes, `aq demo coordinator --routes`).
const (
	// RoutesFull is the contract aq was built to (docs/contract.md): the routes of
	// the coordinator in service today plus those the dispatch redesign
	// proposes (POST /fleet/accept, POST /fleet/fail, deregister, the
	// factories list).
	RoutesFull = "full"
	// RoutesLegacy is exactly the routes of the coordinator in service today
	// (as the coordinator team's "Gigafactory system overview" lists them) that the stub implements, answering
	// every other route as that service (Express) does: 404 with an HTML
	// "Cannot <METHOD> <path>" page. A PATCH to failed or queued records the
	// stage but leaves the lease to lease/release or the reaper.
	RoutesLegacy = "legacy"
)

// RouteSets are the route sets the stub serves, full first.
var RouteSets = []string{RoutesFull, RoutesLegacy}

// ProposedRoutes are the stub's routes the coordinator in service today does
// not have (docs/contract.md, "Without a route: fallbacks"): the redesign's
// accept and fail, deregister, the factories list, replacing or removing a
// job that is not running, and the live log. RoutesLegacy leaves them out.
var ProposedRoutes = []string{RouteAccept, RouteFail, RouteDeregister, RouteFactories, RouteReplace, RouteRemove, RouteLogAppend, RouteLogRead}

// stubRoutes are routes of the stub's own (request counters, fault
// injection): instruments of the double, served in every route set.
var stubRoutes = []string{RouteGetStats, RouteFaults}

// checkRoutes validates Options.Routes and Without.
func checkRoutes(o *Options) error {
	switch o.Routes {
	case "":
		o.Routes = RoutesFull
	case RoutesFull, RoutesLegacy:
	default:
		return fmt.Errorf("unknown route set %q (use %s or %s)", o.Routes, RoutesFull, RoutesLegacy)
	}
	for _, r := range o.Without {
		if !slices.Contains(allRoutes, r) {
			return fmt.Errorf("Options.Without: %q is not one of the stub's routes", r)
		}
	}
	return nil
}

// allRoutes is every route the stub can serve.
var allRoutes = []string{
	RouteEnroll, RouteHeartbeat, RouteFactories, RouteRevoke, RouteDeregister, RouteQueueState, RouteClaim, RouteAccept,
	RouteRenew, RouteRelease, RoutePatch, RouteFail, RouteSubmit, RouteJobs, RouteJob, RouteEvents, RouteAction, RouteReplace, RouteRemove,
	RouteArtifactUpload, RouteArtifactList, RouteArtifactGet, RouteArtifactDelete, RouteLogAppend, RouteLogRead, RouteGetStats, RouteFaults,
}

// Serves reports whether the stub serves route (e.g. RouteFail) with its
// options.
func (s *Server) Serves(route string) bool {
	return s.inSet(route) && !s.lacks(route)
}

// inSet reports whether route is in the stub's route set (Without aside).
func (s *Server) inSet(route string) bool {
	if s.o.Routes == RoutesLegacy && slices.Contains(ProposedRoutes, route) {
		return false
	}
	return slices.Contains(allRoutes, route)
}

// Routes is the route set the stub serves (RoutesFull or RoutesLegacy).
func (s *Server) Routes() string { return s.o.Routes }

// legacy reports whether the stub models today's coordinator.
func (s *Server) legacy() bool { return s.o.Routes == RoutesLegacy }

// expressNotFound answers a route the stub does not serve. In the legacy set it
// answers as the service in use today (Express's finalhandler): 404, an HTML
// page saying "Cannot <METHOD> <path>" — also for a known path with another
// method, since Express has no 405. Otherwise Go's ServeMux answer stands
// ("404 page not found", or 405 with Allow).
func expressNotFound(w http.ResponseWriter, r *http.Request, path string) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Error</title>\n</head>\n<body>\n<pre>Cannot %s %s</pre>\n</body>\n</html>\n",
		html.EscapeString(r.Method), html.EscapeString(path))
}
