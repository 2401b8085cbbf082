// Placeholder until the stage's first source lands.
