// frota-kind-cni: the pod network of the e2e kind cluster, in place of
// kindnetd (whose source the module proxy does not serve, so it cannot be
// built here). It does the two things kindnetd does for a single-network
// cluster, nothing else:
//
//  1. writes this node's CNI config: ptp veths with host-local IPAM on the
//     node's spec.podCIDRs (the plugins come with the node image), which is
//     what makes the kubelet report the node Ready;
//  2. routes every other node's pod CIDRs via that node's InternalIP (all kind
//     nodes share one Docker bridge, so one hop reaches them).
//
// It polls the API server with its ServiceAccount token: nodes are few and
// change only at cluster creation. Pod egress is not masqueraded: in the e2e
// cluster pods talk to pods, Services and nodes, never leave the bridge.
// Standard library only, so it builds offline without a module download.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

type node struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		PodCIDRs []string `json:"podCIDRs"`
	} `json:"spec"`
	Status struct {
		Addresses []struct {
			Type    string `json:"type"`
			Address string `json:"address"`
		} `json:"addresses"`
	} `json:"status"`
}

type config struct {
	nodeName string
	confPath string
	interval time.Duration
}

func main() {
	log.SetFlags(log.LstdFlags | log.Lmsgprefix)
	log.SetPrefix("frota-kind-cni: ")
	cfg := config{
		nodeName: os.Getenv("NODE_NAME"),
		confPath: envOr("CNI_CONF", "/etc/cni/net.d/10-frota-kind.conflist"),
		interval: 5 * time.Second,
	}
	if cfg.nodeName == "" {
		log.Fatal("NODE_NAME is not set (give it spec.nodeName through the downward API)")
	}
	client, base, err := inClusterClient()
	if err != nil {
		log.Fatal(err)
	}
	// Pod traffic between nodes crosses this node: it must forward.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		log.Printf("cannot enable IPv4 forwarding: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	for {
		if err := sync(ctx, client, base, cfg); err != nil {
			log.Print(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.interval):
		}
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// inClusterClient trusts the ServiceAccount's CA and sends its token.
func inClusterClient() (*http.Client, string, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, "", fmt.Errorf("not in a cluster: KUBERNETES_SERVICE_HOST/PORT unset")
	}
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return nil, "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, "", fmt.Errorf("no certificate in %s/ca.crt", saDir)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}, "https://" + net.JoinHostPort(host, port), nil
}

func listNodes(ctx context.Context, client *http.Client, base string) ([]node, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/nodes", nil)
	if err != nil {
		return nil, err
	}
	// Read on every call: the kubelet rotates the projected token.
	token, err := os.ReadFile(filepath.Join(saDir, "token"))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("list nodes: %s", resp.Status)
	}
	var list struct {
		Items []node `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return list.Items, nil
}

func sync(ctx context.Context, client *http.Client, base string, cfg config) error {
	nodes, err := listNodes(ctx, client, base)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.Metadata.Name == cfg.nodeName {
			if err := writeConf(cfg.confPath, n.Spec.PodCIDRs); err != nil {
				return err
			}
			continue
		}
		for _, cidr := range n.Spec.PodCIDRs {
			if err := routeVia(cidr, n); err != nil {
				log.Print(err)
			}
		}
	}
	return nil
}

// writeConf writes the CNI config for this node's pod CIDRs, atomically and
// only when it changes (containerd reloads on every write).
func writeConf(path string, cidrs []string) error {
	if len(cidrs) == 0 {
		return nil // not allocated yet
	}
	ranges := [][]map[string]string{}
	routes := []map[string]string{}
	for _, c := range cidrs {
		ranges = append(ranges, []map[string]string{{"subnet": c}})
		if strings.Contains(c, ":") {
			routes = append(routes, map[string]string{"dst": "::/0"})
		} else {
			routes = append(routes, map[string]string{"dst": "0.0.0.0/0"})
		}
	}
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "frota-kind",
		"plugins": []any{
			map[string]any{
				"type":   "ptp",
				"ipMasq": false,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": "/run/cni-ipam-state",
					"ranges":  ranges,
					"routes":  routes,
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	log.Printf("wrote %s for pod CIDRs %s", path, strings.Join(cidrs, ","))
	return nil
}

// routed remembers the routes set, to log each once.
var routed = map[string]string{}

// routeVia routes cidr through the node's InternalIP of the same family.
func routeVia(cidr string, n node) error {
	v6 := strings.Contains(cidr, ":")
	for _, a := range n.Status.Addresses {
		if a.Type != "InternalIP" || strings.Contains(a.Address, ":") != v6 {
			continue
		}
		out, err := exec.Command("ip", "route", "replace", cidr, "via", a.Address).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip route replace %s via %s: %v: %s", cidr, a.Address, err, out)
		}
		if routed[cidr] != a.Address {
			routed[cidr] = a.Address
			log.Printf("routed %s via %s (node %s)", cidr, a.Address, n.Metadata.Name)
		}
		return nil
	}
	return fmt.Errorf("node %s has no InternalIP for %s yet", n.Metadata.Name, cidr)
}
