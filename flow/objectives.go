package flow

import "fmt"

// Objectives maps an inference objective's name (the value of the
// x-gateway-inference-objective header) to its priority, standing in for
// the seed's InferenceObjective resources.
type Objectives map[string]int

// Priority returns the priority of objective name. As in the seed, a
// missing header ("") or an objective with no priority set falls back to
// priority 0.
func (o Objectives) Priority(name string) int {
	return o[name] // a nil map and an unknown name both give 0
}

func (o Objectives) validate() error {
	for name := range o {
		if name == "" {
			return fmt.Errorf("objectives: an objective needs a name")
		}
	}
	return nil
}
