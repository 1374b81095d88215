// The baseline's own (empty) configuration, so the console's is not applied to it.
export default {};
