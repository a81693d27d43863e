package cli

import (
	"encoding/json"
	"io"
	"text/tabwriter"
)

// writeJSON prints v as indented JSON: the stable, documented form every
// data-printing command offers with --json.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table returns a tabwriter for aligned human output; call Flush when done.
func table(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// writeJSONLine prints v as one compact JSON line (streams of results).
func writeJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// orDash shows an unset field as "-" in human output.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
