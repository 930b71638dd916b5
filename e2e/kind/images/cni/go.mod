module frota.dev/e2e/kind/cni

go 1.24
